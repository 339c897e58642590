"""``fedwear data ...``: list the datasets, inspect one, download one, verify a copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from fedwear.cli.common import fail, one_line_errors
from fedwear.errors import FedwearError

data_app = typer.Typer(
    no_args_is_help=True, help="Datasets: list them, inspect, download or verify one."
)


@data_app.command("list")
def data_list(
    root: Annotated[Path | None, typer.Option(help="also show what this folder holds of each dataset (DIR/<name>)")] = None,
) -> None:
    """Datasets fedwear can read, and which ship with a bundled subset.

    With --root, the status of each under that folder (found, incomplete, empty, not found).
    """
    from fedwear.data import DATASETS, dataset_status
    from fedwear.data.preprocess import bundled_summary

    if root is not None and not root.is_dir():
        fail(f"--root {root} is not a folder: give the folder holding one folder per dataset")
    for name, entry in DATASETS.items():
        summary = bundled_summary(name, getattr(entry, "BUNDLED", ""))
        generated = getattr(entry, "GENERATED", False)
        bundled = f"bundled: {summary}" if summary else ("generated, no files" if generated else "not bundled")
        if root is None:
            typer.echo(f"{name:18s} {bundled:34s} {entry.DESCRIPTION}")
            continue
        status, folder = dataset_status(name, root)
        where = f" ({folder})" if folder is not None else ""
        typer.echo(f"{name:18s} {status}{where}")


@data_app.command("info")
def data_info(
    name: str,
    root: Annotated[Path | None, typer.Option(help="folder with the dataset's files")] = None,
    schema: Annotated[Path | None, typer.Option(help="own data: the YAML schema (default ROOT/schema.yaml)")] = None,
) -> None:
    """The dataset's card: subjects, classes, rates, licence, citation.

    With --root, also the subjects, recordings, samples and label counts of that folder.
    """
    from fedwear.data import DATASETS, card, dataset_info, dataset_module
    from fedwear.data.config import DatasetConfig
    from fedwear.data.preprocess import bundled_root

    with one_line_errors():
        if name not in DATASETS:
            raise FedwearError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)} (`fedwear data list` "
                               "describes them)")
        if root is None and bundled_root(name) is None:
            mod = dataset_module(name)
            info: dict[str, object] = {"name": name, "description": mod.DESCRIPTION, "card": card(name)}
        else:
            cfg = DatasetConfig(name=name, schema_file=str(schema) if schema else None)
            info = dataset_info(name, str(root) if root else None, cfg)
    typer.echo(json.dumps(info, indent=2, default=str))


def _read_check(name: str, root: Path, schema: Path | None = None) -> str:
    """Read every file with the dataset's loader (the format check); one line of counts."""
    from fedwear.data import dataset_module, load_raw
    from fedwear.data.config import DatasetConfig

    raw = load_raw(DatasetConfig(name=name, root=str(root), cache_dir=None,
                                 schema_file=str(schema) if schema else None))  # fmt: skip
    subjects = len({r.subject for r in raw.recordings})
    samples = sum(len(r.labels) for r in raw.recordings)
    counts = f"read: {subjects} subjects, {len(raw.recordings)} recordings, {samples} samples"
    if getattr(dataset_module(name), "KIND", "classification") != "regression":
        return f"{counts}, {len(raw.class_names)} classes"
    # A forecasting dataset has no classes: name the series and its range instead.
    values = [r.signal for r in raw.recordings if len(r.signal)]
    low = min(float(np.nanmin(v)) for v in values) if values else float("nan")
    high = max(float(np.nanmax(v)) for v in values) if values else float("nan")
    channels = ", ".join(dict.fromkeys(c for r in raw.recordings for c in r.channels))
    return f"{counts}, forecasting target {channels} (values {low:.1f} to {high:.1f})"


@data_app.command("download")
def data_download(
    name: str,
    root: Annotated[Path | None, typer.Option(help="folder to create (default: <user data dir>/fedwear/NAME)")] = None,
    url: Annotated[str | None, typer.Option(help="download from this URL instead (a mirror)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bar")] = False,
) -> None:
    """Download a dataset from its official source, check its SHA-256 values and unpack it."""
    from fedwear.data.download import RECORD, download, source

    with one_line_errors():
        src = source(name)
        done = download(src, root, url, quiet=quiet)
    if not done.fresh:
        state = "already present and verified"
    elif src.archive_sha256 is not None:
        state = "downloaded; archive SHA-256 matches the pinned value"
    elif src.pinned_files:
        state = f"downloaded; archive SHA-256 unknown ({src.archive_pin}), every file verified"
    else:
        state = "downloaded; archive SHA-256 not pinned (no published value), files not pinned either"
    typer.echo(f"{name}: {state}: {done.report.summary()}")
    if done.fresh and src.archive_sha256 is None:
        typer.echo(f"archive SHA-256 {done.archive_sha256} ({done.archive_bytes:,} bytes): not checked "
                   f"against any pinned value; recorded in {done.root / RECORD}")
    if not src.pinned_files:
        with one_line_errors():
            typer.echo(f"{name}: {_read_check(name, done.root)}")
    typer.echo(f"{'saved to' if done.fresh else 'folder'}: {done.root}")
    typer.echo(f"use it with: --set dataset.root={done.root}")


@data_app.command("verify")
def data_verify(
    name: str,
    root: Annotated[Path, typer.Option(help="folder holding the dataset's files")],
    schema: Annotated[Path | None, typer.Option(help="own data: the YAML schema (default ROOT/schema.yaml)")] = None,
) -> None:
    """Check a dataset folder: its files (X or X.gz), counts and pinned SHA-256 values.

    Datasets without pinned hashes (and own data) are read file by file with the loader.
    """
    from fedwear.data import DATASETS, usc_had
    from fedwear.data.download import all_sources, source, verify

    with one_line_errors():
        if not root.is_dir():
            raise FedwearError(f"{root} is not a folder: give --root the dataset's folder")
        if name not in all_sources() and name in DATASETS and not getattr(DATASETS[name], "GENERATED", False):
            typer.echo(f"{name}: OK: {_read_check(name, root, schema)} ({root}); no download entry, "
                       "so no layout or SHA-256 to check")  # fmt: skip
            return
        src = source(name)
        if name == "usc_had" and (line := usc_had.wrong_root(root)):
            raise FedwearError(line)
        report = verify(src, root)
    if not report.ok:
        for p in report.problems:
            typer.echo(f"error: {root / p.path}: {p.issue}: {p.fix}", err=True)
        raise typer.Exit(2)
    with one_line_errors():
        read = "" if src.pinned_files else f"; {_read_check(name, root, schema)}"
    typer.echo(f"{name}: OK: {report.summary()}{read} ({root})")
