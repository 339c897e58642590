"""The ``fedwear`` command line: run, compare, tune, data, methods, flower."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedwear import files
from fedwear.cli.common import (
    GRID_GOES_ON,
    PARALLEL,
    ExecutorOpt,
    RayAddressOpt,
    SetOpt,
    SlurmOpt,
    announce,
    check_method_names,
    console_logging,
    echo_listing,
    executor_options,
    file_system_error,
    name_list,
    one_line_errors,
    parse_seeds,
    reflow_help,
)
from fedwear.cli.data import data_app
from fedwear.cli.export import export
from fedwear.cli.flower import flower_app
from fedwear.cli.reference import config_reference
from fedwear.cli.report import report
from fedwear.cli.reproduce import reproduce
from fedwear.cli.tune import tune
from fedwear.errors import FedwearError

app = typer.Typer(add_completion=False, no_args_is_help=True)


OutOpt = Annotated[Path | None, typer.Option(help="run directory (default runs/<dataset>-<method>-s<seed>-<hash>, "
                                                 "numbered -2, -3... when run again; --resume/--overwrite: the latest)")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue the run directory's run from its last checkpoint (a finished run is reused)")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="replace the run already in the run directory")]
FAILED_ROUNDS_EXIT = 3


def run(
    config: Path,
    set_: SetOpt = None,
    out: OutOpt = None,
    resume: ResumeOpt = False,
    overwrite: OverwriteOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bar (CI, scripts)")] = False,
) -> None:
    """Run one experiment from a YAML config."""
    from fedwear.api import run as run_api
    from fedwear.config import load_config
    from fedwear.report.tables import summary_table

    console_logging()
    with one_line_errors(ctrl_c=True):
        result = run_api(load_config(config, set_ or []), out, resume=resume, quiet=quiet, overwrite=overwrite)
    typer.echo(summary_table(result.summary))
    typer.echo(f"run directory: {result.out_dir}")
    _exit_on_failed_rounds({str(result.out_dir): result.summary})


def _exit_on_failed_rounds(summaries: dict[str, dict]) -> None:
    """Exit with status 3 when a run had rounds in which no valid client reply was aggregated."""
    bad = {where: s["failed_rounds"] for where, s in summaries.items() if s.get("failed_rounds")}
    for where, rounds in bad.items():
        typer.echo(f"warning: {where}: {len(rounds)} round(s) aggregated no valid client reply "
                   f"(rounds {', '.join(map(str, rounds[:10]))}{' ...' if len(rounds) > 10 else ''}); "
                   "see its run.log", err=True)
    if bad:
        raise typer.Exit(FAILED_ROUNDS_EXIT)


def compare(
    config: Path,
    methods: Annotated[str, typer.Option(help="comma-separated methods, e.g. fedavg,fedprox,local")],
    seeds: Annotated[str, typer.Option(help="comma-separated seeds")] = "0",
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(help="folder for the runs and the table")] = None,
    select: Annotated[str, typer.Option(help="final or best")] = "final",
    jobs: Annotated[int, typer.Option(
        min=1, metavar="N", help="runs in parallel (processes); threads are split between them", rich_help_panel=PARALLEL)] = 1,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="redo every run (default: reuse finished runs, resume unfinished ones)")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    slurm: SlurmOpt = None,
    test_against: Annotated[str | None, typer.Option(help="a method of --methods: test each other method against "
                                                          "it on evaluation.best_metric, paired by (seed, client): "
                                                          "a t test whose variance holds the seeds and the "
                                                          "clients, Holm-corrected, with its 95% interval")] = None,
    cost: Annotated[bool, typer.Option("--cost", help="end the table with each method's on-device cost: its "
                                                      "first run's first client's model exported as ONNX "
                                                      "(needs fedwear[export])")] = False,
) -> None:
    """Run several methods x seeds on one config; write a mean +- std table (Markdown and CSV).

    Into an existing folder, finished runs of the same config are reused and unfinished ones
    resume from their checkpoints, so an interrupted comparison continues with the same command.
    """
    from fedwear.commands import compare as run_comparison

    console_logging()
    with one_line_errors(ctrl_c=True, grid=GRID_GOES_ON):
        if select not in ("final", "best"):
            raise FedwearError(f"--select {select!r}: use final or best")
        slurm_options = executor_options(executor, slurm)
        if not (names := name_list(methods)):
            raise FedwearError("--methods: give at least one method, e.g. --methods fedavg,local")
        check_method_names("--methods", names)
        if test_against is not None and test_against not in names:
            raise FedwearError(f"--test-against {test_against!r} is not one of --methods ({', '.join(names)}): "
                               "name the reference among them")
        result = run_comparison(config, names, parse_seeds("--seeds", seeds), out, set_ or [], jobs, select,
                                test_against, overwrite, quiet, executor, ray_address, slurm_options,
                                on_done=announce if jobs > 1 or executor != "local" else None, cost=cost)
    typer.echo(result.markdown)
    typer.echo(f"\ntable: {result.out_dir / files.TABLE_MD} and {result.out_dir / files.TABLE_CSV}")
    _exit_on_failed_rounds({f"{result.out_dir / name}-s{s['seed']}": s
                            for name, runs in result.summaries.items() for s in runs})


def methods_cmd(
    names: Annotated[list[str] | None, typer.Argument(help="the methods to show (default: all)")] = None,
) -> None:
    """Methods with one-line descriptions and their options.

    In a terminal the lines wrap to its width; piped, each method and each option stays one line
    (for grep).
    """
    from fedwear.methods import METHODS

    with one_line_errors():
        check_method_names("fedwear methods", names or [])
    for name in names or METHODS:
        cls = METHODS[name]
        marks = ["cpu or cuda" if "cuda" in cls.devices else "cpu"]
        if getattr(cls, "trains_together", False):  # engine=batched may train its clients together
            marks.append("batched: clients trained together")
        marks.append("central DP" if cls.private() else f"no central DP: {cls.no_dp_reason}")
        echo_listing(f"{name:12s} {cls.summary} [{'; '.join(marks)}]", 13)
        for opt, field in cls.Options.model_fields.items():
            echo_listing(f"{'':12s}   {name}.{opt} = {field.default!r}: {field.description or ''}", 17)


def _version(show: bool) -> None:
    if show:
        from fedwear.version import __version__, library_versions

        typer.echo(f"fedwear {__version__}")
        for name, value in library_versions().items():  # what a run's numbers depend on, as summary.json records
            typer.echo(f"  {name}: {value or 'not installed'}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                          help="fedwear's version, and the libraries and CPU a run's numbers depend on")] = False,
) -> None:
    """Personalized federated learning on wearable sensor data."""


# `fedwear --help` lists the commands in these groups, in this order.
EXPERIMENTS, SETUP = "Experiments", "Data, methods and configs"
for name, command, panel in (
    ("run", run, EXPERIMENTS), ("compare", compare, EXPERIMENTS), ("reproduce", reproduce, EXPERIMENTS),
    ("tune", tune, EXPERIMENTS), ("report", report, EXPERIMENTS),
    ("methods", methods_cmd, SETUP), ("config-reference", config_reference, SETUP),
):
    app.command(name, rich_help_panel=panel)(command)
app.add_typer(data_app, name="data", rich_help_panel=SETUP)
app.add_typer(flower_app, name="flower", rich_help_panel="Deployment")
app.command(export.__name__, rich_help_panel="Deployment")(export)
reflow_help(app)


def main() -> None:
    """The ``fedwear`` entry point. A file-system error (a full disk, a read-only output folder)
    ends any command with one line naming the path and exit status 2, not a traceback; what
    the command wrote before it stays where it is."""
    try:
        app()
    except OSError as e:
        if (line := file_system_error(e)) is None:
            raise
        typer.echo(f"error: {line}", err=True)
        raise SystemExit(2) from None
