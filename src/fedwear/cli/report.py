"""``fedwear report``: plots and one self-contained HTML page for a run or comparison folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedwear.cli.common import fail
from fedwear.errors import FedwearError


def report(
    path: Annotated[Path, typer.Argument(help="run directory (from `fedwear run`) or "
                                         "comparison directory (from `fedwear compare`)")],
    out: Annotated[Path | None, typer.Option(
        help="folder for index.html and the PNGs (default PATH/report)")] = None,
    embeddings: Annotated[bool, typer.Option(
        "--embeddings", help="also a t-SNE of each method's body embeddings from its last "
        "checkpoint (ProtoHAR Fig. 4; loads the data)")] = False,
    root: Annotated[Path | None, typer.Option(
        help="with --embeddings: the dataset folder, instead of dataset.root of the runs' "
        "config.yaml")] = None,
) -> None:
    """Write PNG plots and one self-contained index.html for a run or a comparison."""
    from fedwear.report.build import write_report

    if root is not None and not embeddings:
        fail("--root is only used with --embeddings: add --embeddings or drop --root")
    try:
        index = write_report(path, out, embeddings, root)
    except FedwearError as e:
        fail(e)
    typer.echo(str(index))
