"""``fedwear report``: plots and one self-contained HTML page for a run or comparison folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import yaml

from fedwear.cli.common import command_line, fail
from fedwear.errors import ConfigError, FedwearError

if TYPE_CHECKING:
    from fedwear.report.headline import PaperNumbers
    from fedwear.reproduce import Experiment

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
    from fedwear.report.build import write_report

    command = command_line("fedwear report", [str(path)], (
        ("--out", out), ("--root", root), ("--client", client),
        ("--tsne-windows", tsne_windows if tsne_windows != TSNE_WINDOWS else None),
        ("--reference", reference), ("--format", fmt if fmt != "png" else None),
        ("--embeddings", embeddings or None), ("--no-forecast", None if forecast else True)))
    try:
        index = write_report(path, out, embeddings, root, forecast, client, tsne_windows, command,
                             reference=reference, paper=paper_numbers(path), fmt=fmt)
    except FedwearError as e:
        fail(e)
    typer.echo(str(index))


def _runs_dataset(path: Path) -> str | None:
    """``dataset.name`` of the run at ``path`` or of the first run folder under it (config.yaml)."""
    for cfg in [path / "config.yaml", *sorted(path.glob("*/config.yaml"))]:
        try:
            data = yaml.safe_load(cfg.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        name = ((data or {}).get("dataset") or {}).get("name") if isinstance(data, dict) else None
        if name:
            return str(name)
    return None


def _table_values(exp: Experiment) -> tuple[dict[str, dict[tuple[str, str], float]], str]:
    """The paper's numbers of ``exp``'s table as ``{name: {(view, metric): value}}`` in
    metrics.csv's units, and why there are none ('' when there are some).

    A table with ``metrics`` (ProtoHAR's, PCFedH's): each row is a method's personalized view, a
    cell a number or ``[mean, std]`` (the mean is drawn). Meta-HAR's (``writer: budgets``): a row
    ``<method>@<budget>`` is ``[meta-train, meta-test]`` accuracy, the views ``personalized@<budget>``
    and ``new_clients@<budget>``. Tables by dataset columns (FedAli's, FedMAT's) are on other datasets
    than fedwear's runs of them: none."""
    from fedwear.config import METRICS
    from fedwear.reproduce import paper_table

    table = paper_table(exp.paper) if exp.paper else {}
    rows = table.get("rows") or {}
    if not exp.paper:
        return {}, (f"`{exp.key}` has no paper table of its own"
                    + (f" (it compares with our runs of {exp.reference})" if exp.reference else ""))
    values: dict[str, dict[tuple[str, str], float]] = {}
    if table.get("metrics"):
        for name, row in rows.items():
            for metric, cell in zip(table["metrics"], row or [], strict=False):
                v = cell[0] if isinstance(cell, list) else cell
                if v is not None:
                    values.setdefault(str(name), {})[("personalized", metric)] = float(v) / (100 if metric in METRICS else 1)
        return values, ""
    if exp.writer == "budgets":
        for name, row in rows.items():
            method, _, budget = str(name).partition("@")
            suffix = f"@{budget}" if budget else ""
            for view, v in zip((f"personalized{suffix}", f"new_clients{suffix}"), row or [], strict=False):
                if v is not None:
                    values.setdefault(method, {})[(view, "accuracy")] = float(v) / 100
        return values, ""
    return {}, f"{exp.paper} reports {table.get('datasets', 'other datasets')}, not the data these runs use"


def paper_numbers(path: Path) -> PaperNumbers:
    """The published numbers ``fedwear report`` draws beside a comparison (or a run inside one).

    The rule: a folder belongs to a registered paper table when its name is the run folder that
    ``fedwear reproduce <paper>:<table>`` writes by default (``runs/<folder>``: the experiment's
    ``folder``, else its key with ``:`` as ``-``, e.g. ``protohar-table2``; for a single run, its
    parent folder's name) and its runs use the table's dataset. Several tables share a folder
    (ProtoHAR's Tables II and IV): each method's numbers come from the first table, in
    ``fedwear reproduce``'s order, that has the method. Otherwise there is no paper number, and why."""
    from fedwear.config import load_config
    from fedwear.report.headline import PaperNumbers
    from fedwear.report.rundir import is_run_dir
    from fedwear.reproduce import EXPERIMENTS, config_path, default_out, paper_table

    folder = Path(path).resolve()
    if is_run_dir(folder):
        folder = folder.parent
    matched = [e for e in EXPERIMENTS.values() if default_out(e).name == folder.name]
    if not matched:
        return PaperNumbers(none=f"the folder {folder.name!r} is not the run folder of a registered paper "
                                 "table (`fedwear reproduce <paper>:<table>` writes runs/<paper>-<table>, e.g. "
                                 "runs/protohar-table2), so which paper table it belongs to is not known")
    dataset = _runs_dataset(Path(path))
    values: dict[str, dict[tuple[str, str], float]] = {}
    sources: dict[str, str] = {}
    why = []
    for exp in matched:
        try:
            want = load_config(config_path(exp)).dataset.name
        except ConfigError:
            want = None
        if dataset is not None and want is not None and dataset != want:
            why.append(f"`{exp.key}` runs on {want}, these runs on {dataset}")
            continue
        got, none = _table_values(exp)
        if none:
            why.append(none)
            continue
        for name, cells in got.items():
            if name not in values:  # the first table that has the method gives its numbers
                values[name] = cells
                sources[name] = f"{paper_table(exp.paper)['source']} (`fedwear reproduce {exp.key}`)"
    rule = f"matched by the folder name {folder.name!r}, that table's run folder"
    if not values:
        return PaperNumbers(none=f"{rule}, but " + "; ".join(why or ["its table has no number"]))
    return PaperNumbers(values, f"as published, with the paper's own selection of round and statistic; {rule}",
                        sources=sources)
