"""``fedwear tune``: an Optuna study on the validation split, then the best config on the test split."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from fedwear import files
from fedwear.cli.common import SetOpt, console_logging, fail, interrupted, parse_seeds
from fedwear.errors import FedwearError


def tune(
    config: Path,
    space: Annotated[Path, typer.Option(help="YAML: config key -> {low, high, log} or {choices: [...]}")],
    trials: Annotated[int, typer.Option(min=1, metavar="N", help="finished trials the study should hold, over all its workers")] = 20,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(help="folder for the trials' runs and the study's journal file")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL shared by several machines (e.g. "
                                                     "sqlite:///study.db); default: a journal file in --out")] = None,
    study: Annotated[str | None, typer.Option(help="study name (default: the config's file name)")] = None,
    best: Annotated[bool, typer.Option("--best", help="run the study's best trial and the config's own values on the test "
                                            "split over --seeds; write the table")] = False,
    seeds: Annotated[str, typer.Option(help="--best: comma-separated seeds")] = "0,1,2",
    jobs: Annotated[int, typer.Option(min=1, metavar="N", help="--best: runs in parallel (processes)")] = 1,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
) -> None:
    """Search hyperparameters with Optuna on the validation split; --best tests the best trial.

    The study samples with TPE and prunes by the median on each evaluated round, on the
    validation split only (dataset.val_fraction > 0). Several `fedwear tune` processes with the
    same --out (or --storage) share one study. With --best, the best trial and the config's own
    values run on the test split over --seeds.
    """
    from fedwear import tune as tuning

    console_logging()
    root = out or Path("runs") / f"tune-{Path(config).stem}"
    try:
        cfg = tuning.tuning_config(config, set_ or [])
        if not best:
            result = tuning.search(config, space, trials, root, set_, storage, study, quiet=quiet)
            _print_study(result)
            return
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        found = optuna.load_study(study_name=study or Path(config).stem, storage=tuning.storage_of(root, storage))
        tuned = tuning.best_sets(found)
        md = _best_table(config, set_ or [], tuned, parse_seeds("--seeds", seeds), root / "best", jobs, quiet, cfg.method)
    except FedwearError as e:
        fail(e)
    except KeyError as e:  # optuna.load_study: no such study
        fail(f"no study {e} in {storage or root / tuning.JOURNAL}: run `fedwear tune` without --best first")
    except KeyboardInterrupt as e:
        interrupted(e, "run the same command again: the study keeps its finished trials")
    typer.echo(md)
    typer.echo(f"\ntable: {root / 'best' / files.TABLE_MD}")


def _print_study(study) -> None:
    import optuna

    states = optuna.trial.TrialState
    done = study.get_trials(states=(states.COMPLETE,))
    pruned = study.get_trials(states=(states.PRUNED,))
    typer.echo(f"study {study.study_name}: {len(done)} complete, {len(pruned)} pruned trials; "
               f"objective: {study.user_attrs.get('objective', '?')} ({study.direction.name.lower()})")
    for t in sorted(done, key=lambda t: t.value, reverse=study.direction.name == "MAXIMIZE")[:5]:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t.params.items())
        typer.echo(f"  trial {t.number}: {t.value:.4f}  {params}")
    if done:
        typer.echo("run the best on the test split with the same command and --best")


def _best_table(config: Path, sets: list[str], tuned: list[str], seeds: list[int], root: Path, jobs: int,
                quiet: bool, method: str) -> str:
    """The config's own values and the best trial's, each over ``seeds`` on the test split."""
    from fedwear.compare import run_grid
    from fedwear.config import load_config
    from fedwear.report.tables import comparison_table

    threads = None if jobs == 1 else max(1, (os.cpu_count() or 1) // jobs)
    rows = {method: [], f"{method}-tuned": tuned}
    runs = [(name, load_config(config, [*sets, *extra, f"seed={seed}", *([f"threads={threads}"] if threads else [])]),
             root / f"{name}-s{seed}") for name, extra in rows.items() for seed in seeds]
    done = run_grid(runs, jobs, False, quiet)
    summaries = {name: [done[where] for n, _, where in runs if n == name] for name in rows}
    md, frame = comparison_table(summaries, "final", load_config(config, sets))
    md += f"\n\n{method}-tuned: {' '.join(tuned)} (the study's best trial, chosen on the val split)"
    root.mkdir(parents=True, exist_ok=True)
    (root / files.TABLE_MD).write_text(md + "\n")
    frame.to_csv(root / files.TABLE_CSV, index=False)
    return md
