"""``fedwear reproduce <paper>:<table>``: re-run a published table and put it next to the paper's."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedwear.cli.common import (
    CLAIMS,
    GRID_GOES_ON,
    OUTPUT,
    PARALLEL,
    ExecutorOpt,
    RayAddressOpt,
    SetOpt,
    SlurmOpt,
    announce,
    command_line,
    console_logging,
    echo_listing,
    executor_options,
    name_list,
    one_line_errors,
    parse_seeds,
)
from fedwear.errors import FedwearError

if TYPE_CHECKING:
    from fedwear.compare import GridStatus


def reproduce(
    table: Annotated[str | None, typer.Argument(help="e.g. protohar:table2 (--list shows all); with --claims: a paper (protohar) or none for all")] = None,
    root: Annotated[str | None, typer.Option(help="folder of the dataset's original files (dataset.root)")] = None,
    seeds: Annotated[str | None, typer.Option(help="comma-separated seeds to run for every method (default: the "
                                                   "table's); the results file still covers the table's seeds")] = None,
    methods: Annotated[str | None, typer.Option(help="comma-separated methods to run (default: all the table's); "
                                                     "the results file still covers the whole table")] = None,
    set_: SetOpt = None,
    until: Annotated[int | None, typer.Option(min=1, metavar="ROUND", help="bring every run to this round, then stop "
                                              "(resumable): a table's rows at one round before any goes further")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="start the selected runs again from round 0 (with "
                                            "--methods and --seeds: only those); the default reuses or resumes them")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
    jobs: Annotated[int, typer.Option(min=1, metavar="N", help="runs in parallel (one process each)",
                                      rich_help_panel=PARALLEL)] = 1,
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    slurm: SlurmOpt = None,
    out: Annotated[Path | None, typer.Option(help="folder of the run folders (default runs/<paper>-<table>)",
                                             rich_help_panel=OUTPUT)] = None,
    results: Annotated[Path | None, typer.Option(help="results file (default results/<table's file>)",
                                                 rich_help_panel=OUTPUT)] = None,
    report_only: Annotated[bool, typer.Option("--report-only", help="write the results file from the runs made so "
                                              "far; run nothing", rich_help_panel=OUTPUT)] = False,
    at_round: Annotated[int | None, typer.Option(min=1, metavar="ROUND", help="write the results file from each run "
                                                 "as it stood at this round: rows that ran further are cut back to it",
                                                 rich_help_panel=OUTPUT)] = None,
    list_: Annotated[bool, typer.Option("--list", help="list the tables that can be reproduced",
                                        rich_help_panel=OUTPUT)] = False,
    claims: Annotated[bool, typer.Option("--claims", help="test the papers' registered claims on the run folders "
                                         "and write the ledger with the test's calibration (default "
                                         "results/claims.md); runs nothing; --root: "
                                         "the folder of the datasets' folders (default ../shared/data)",
                                         rich_help_panel=CLAIMS)] = False,
    runs_root: Annotated[Path, typer.Option(help="with --claims: the folder of the tables' run folders",
                                            rich_help_panel=CLAIMS)] = Path("results/runs"),
) -> None:
    """Run a paper's table and write its results file beside the paper's numbers.

    Resumable: the same command continues an interrupted table. The results file gives the
    paper's numbers, the differences, and a flag where one exceeds 2 points.
    """
    from fedwear import reproduce as rp
    from fedwear.compare import run_grid
    from fedwear.reproduce.results import write_results

    console_logging()
    with one_line_errors(ctrl_c=True, grid=GRID_GOES_ON):
        if claims:
            typer.echo(_write_claims(table, root, runs_root, results))
            return
        if list_ or table is None:
            from fedwear.reproduce.run_files import table_progress

            width = max(map(len, rp.EXPERIMENTS))
            for key, exp in rp.EXPERIMENTS.items():
                folder = rp.default_out(exp)
                status = f"; {folder}: {table_progress(rp.plan(exp, folder, None))}" if folder.is_dir() else ""
                echo_listing(f"{key:{width}s}  {exp.title} ({len(exp.methods)} methods{status})", width + 2)
            return
        if report_only and overwrite:
            raise FedwearError("--overwrite with --report-only: --report-only runs nothing, so drop one of them")
        exp = rp.experiment(table)
        folder = out or rp.default_out(exp)
        runs = rp.plan(exp, folder, root, parse_seeds("--seeds", seeds) if seeds else None, set_)
        todo = runs if methods is None else rp.only_methods(exp, runs, name_list(methods))
        # the results file covers the whole table: its planned runs, and any run --seeds adds beyond them
        # (then its command keeps --seeds and --methods, else the table's own command remakes the file)
        table_runs = rp.plan(exp, folder, root, None, set_)
        extra = [r for r in todo if r[2] not in {where for _, _, where in table_runs}]
        runs = table_runs + extra
        # the command that makes the runs and the results file, as that file states it (--report-only,
        # --overwrite and --quiet change neither, so they are left out)
        command = command_line("fedwear reproduce", [table], [
            ("--root", root), ("--seeds", seeds if extra else None), ("--methods", methods if extra else None),
            ("--jobs", jobs if jobs > 1 else None), ("--out", out), ("--results", results), ("--until", until),
            ("--at-round", at_round), *(("--set", item) for item in set_ or [])])
        target = results or Path("results") / exp.results
        if root is not None and executor == "local" and not report_only and not Path(root).is_dir():
            name = runs[0][1].dataset.name
            what = ("the folder holding its datasets' folders" if name == "merged" else
                    f"the folder of the {name} dataset's original files")
            raise FedwearError(f"--root {root}: no such folder; pass {what} (see docs/data.md)")
        if not report_only:
            typer.echo(f"{len(todo)} runs into {folder} (finished ones are reused, others resume)", err=True)

            def progress(status: GridStatus, where: Path) -> None:
                announce(status, where)
                write_results(exp, runs, target, command, folder, at_round)

            run_grid(todo, jobs, overwrite, quiet=quiet or executor != "local", on_done=progress,
                     until=until, executor=executor, address=ray_address, slurm=executor_options(executor, slurm))
        typer.echo(write_results(exp, runs, target, command, folder, at_round))
        typer.echo(f"results: {target}")


def _write_claims(table: str | None, root: str | None, runs_root: Path, results: Path | None) -> str:
    """``fedwear reproduce --claims``: the ledger of every paper's claims (or one paper's: ``table``
    names it), from the run folders under ``runs_root``."""
    from fedwear.reproduce import claims as cl

    if table is not None and table not in cl.PAPERS:
        raise FedwearError(f"--claims {table!r}: name a paper ({', '.join(cl.PAPERS)}) or none for all")
    command = command_line("fedwear reproduce", [table] if table else [],
                           [("--claims", True), ("--root", root), ("--results", results),
                            ("--runs-root", runs_root if runs_root != Path("results/runs") else None)])
    target = results or Path("results") / "claims.md"
    papers = {p: cl.paper_claims(p) for p in ([table] if table else cl.PAPERS)}
    text = cl.write_ledger(papers, target, command, runs_root, Path(root or "../shared/data"))
    return text + f"\nclaims: {target}"
