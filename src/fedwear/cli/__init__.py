"""The ``fedwear`` command line: run, compare, data, methods, flower."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedwear.cli.common import SetOpt, console_logging, fail
from fedwear.cli.data import data_app
from fedwear.cli.flower import flower_app
from fedwear.cli.report import report
from fedwear.errors import FedwearError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Personalized federated learning on wearable sensor data.")
app.add_typer(data_app, name="data")
app.add_typer(flower_app, name="flower")
app.command("report")(report)


@app.command()
def run(
    config: Path,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(help="run directory (default runs/<dataset>-<method>-s<seed>-<hash>)")] = None,
    resume: Annotated[bool, typer.Option(help="continue from the run directory's last checkpoint")] = False,
    quiet: Annotated[bool, typer.Option(help="no progress bar (CI, scripts)")] = False,
) -> None:
    """Run one experiment from a YAML config."""
    from fedwear.api import run as run_api
    from fedwear.config import load_config
    from fedwear.report.tables import summary_table

    console_logging(quiet)
    try:
        cfg = load_config(config, set_ or [])
        result = run_api(cfg, out, resume=resume, quiet=quiet)
    except FedwearError as e:
        fail(e)
    except KeyboardInterrupt:
        typer.echo("interrupted: continue with the same command plus --resume", err=True)
        raise typer.Exit(130) from None
    typer.echo(summary_table(result.summary))
    typer.echo(f"run directory: {result.out_dir}")


@app.command()
def compare(
    config: Path,
    methods: Annotated[str, typer.Option(help="comma-separated methods, e.g. fedavg,fedprox,local")],
    seeds: Annotated[str, typer.Option(help="comma-separated seeds")] = "0",
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(help="folder for the runs and the table")] = None,
    select: Annotated[str, typer.Option(help="final or best")] = "final",
    quiet: Annotated[bool, typer.Option(help="no progress bars")] = False,
) -> None:
    """Run several methods x seeds on one config; write a mean +- std table (Markdown and CSV)."""
    from fedwear.api import run as run_api
    from fedwear.config import load_config
    from fedwear.report.tables import comparison_table

    console_logging(quiet)
    try:
        if select not in ("final", "best"):
            raise FedwearError(f"--select {select!r}: use final or best")
        names = [m.strip() for m in methods.split(",") if m.strip()]
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        base = load_config(config, set_ or [])
        root = out or Path("runs") / f"compare-{Path(config).stem}"
        summaries: dict[str, list[dict]] = {}
        for name in names:
            load_config(config, [*(set_ or []), f"method={name}"])  # validate every method up front
        for name in names:
            for seed in seed_list:
                cfg = load_config(config, [*(set_ or []), f"method={name}", f"seed={seed}"])
                res = run_api(cfg, root / f"{name}-s{seed}", quiet=quiet)
                summaries.setdefault(name, []).append(res.summary)
        md, frame = comparison_table(summaries, select, base)
    except (FedwearError, ValueError) as e:
        fail(e)
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.md").write_text(md + "\n")
    frame.to_csv(root / "table.csv", index=False)
    typer.echo(md)
    typer.echo(f"\ntable: {root / 'table.md'} and {root / 'table.csv'}")


@app.command("methods")
def methods_cmd() -> None:
    """Methods with one-line descriptions and their options."""
    from fedwear.methods import METHODS

    for name, cls in METHODS.items():
        typer.echo(f"{name:12s} {cls.summary}")
        for opt, field in cls.Options.model_fields.items():
            typer.echo(f"{'':12s}   {name}.{opt} = {field.default!r}: {field.description or ''}")


def main() -> None:
    app()


