"""``fedwear data ...``: list the datasets, inspect one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedwear.cli.common import fail
from fedwear.errors import FedwearError

data_app = typer.Typer(no_args_is_help=True, help="Datasets: list them, inspect one.")


@data_app.command("list")
def data_list() -> None:
    """Datasets fedwear can read."""
    from fedwear.data import DATASETS

    for name, entry in DATASETS.items():
        typer.echo(f"{name:12s} {entry.DESCRIPTION}")


@data_app.command("info")
def data_info(name: str, root: Annotated[Path | None, typer.Option(help="folder with the dataset's files")] = None) -> None:
    """Subjects, recordings, samples and label counts of a dataset."""
    from fedwear.data import dataset_info

    try:
        info = dataset_info(name, str(root) if root else None)
    except FedwearError as e:
        fail(e)
    typer.echo(json.dumps(info, indent=2, default=str))


