"""``fedwear report``: plots and one self-contained HTML page for a run or comparison folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedwear.cli.common import command_line, one_line_errors

#: Default of --tsne-windows (fedwear.report.prototypes.TSNE_WINDOWS; the report modules are
#: imported only when the command runs).
TSNE_WINDOWS = 500


def report(
    path: Annotated[Path, typer.Argument(help="run directory (from `fedwear run`) or "
                                         "comparison directory (from `fedwear compare`)")],
    out: Annotated[Path | None, typer.Option(
        help="folder for index.html and the PNGs (default PATH/report)")] = None,
    embeddings: Annotated[bool, typer.Option(
        "--embeddings", help="also a t-SNE of each method's body embeddings from its last "
        "checkpoint (ProtoHAR Fig. 4; loads the data)")] = False,
    root: Annotated[Path | None, typer.Option(
        help="with --embeddings or a regression run's figures: the dataset folder, instead of "
        "dataset.root of the runs' config.yaml")] = None,
    forecast: Annotated[bool, typer.Option(
        "--forecast/--no-forecast", help="regression runs: predicted vs true heart rate of one "
        "client over time (PCFedH Fig. 4) and, with PCFedH's encoder in the checkpoint, a t-SNE "
        "of its features by nearest prototype (PCFedH Fig. 3); loads the data")] = True,
    client: Annotated[str | None, typer.Option(
        help="regression runs: the client whose heart rate is drawn (default: the first "
        "training client)")] = None,
    tsne_windows: Annotated[int, typer.Option(
        min=2, help="regression runs with PCFedH's encoder: train windows sampled for the "
        "t-SNE")] = TSNE_WINDOWS,
    reference: Annotated[str | None, typer.Option(
        help="the method the headline figure and the tables mark as the reference (default: the "
        "comparison's first method)")] = None,
    fmt: Annotated[str, typer.Option(
        "--format", help="png (300 dpi), or pdf / svg: each figure also as that vector file beside "
        "its PNG, for a paper")] = "png",
) -> None:
    """Write PNG plots and one self-contained index.html for a run or a comparison."""
    from fedwear.commands import report as write_report

    command = command_line("fedwear report", [str(path)], (
        ("--out", out), ("--root", root), ("--client", client),
        ("--tsne-windows", tsne_windows if tsne_windows != TSNE_WINDOWS else None),
        ("--reference", reference), ("--format", fmt if fmt != "png" else None),
        ("--embeddings", embeddings or None), ("--no-forecast", None if forecast else True)))
    with one_line_errors():
        index = write_report(path, out, fmt, embeddings=embeddings, root=root, forecast=forecast, client=client,
                             tsne_windows=tsne_windows, command=command, reference=reference)
    typer.echo(str(index))
