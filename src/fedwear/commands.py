"""The Python functions behind ``fedwear compare`` and ``fedwear report`` (``fedwear.run`` is
:func:`fedwear.api.run`): what a notebook or a script calls, with the commands' defaults."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import yaml

from fedwear import files
from fedwear.config import load_config
from fedwear.errors import ConfigError, FedwearError
from fedwear.rundir import RunLock

if TYPE_CHECKING:
    from fedwear.report.headline import PaperNumbers
    from fedwear.reproduce import Experiment


@dataclass
class Comparison:
    """What :func:`compare` wrote: ``out_dir`` holds one run folder per (method, seed) and the
    table (``table.md``, ``table.csv``); ``table`` is that CSV, ``markdown`` the Markdown,
    ``summaries`` each method's runs' ``summary.json`` in seed order."""

    out_dir: Path
    table: pd.DataFrame
    markdown: str
    summaries: dict[str, list[dict]]


def compare(
    config: str | Path,
    methods: Sequence[str],
    seeds: Sequence[int] = (0,),
    out_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
    jobs: int = 1,
    select: str = "final",
    test_against: str | None = None,
    overwrite: bool = False,
    quiet: bool = True,
    executor: str = "local",
    address: str | None = None,
    slurm: dict | None = None,
    on_done: Callable | None = None,
    cost: bool = False,
) -> Comparison:
    """Run every method of ``methods`` at every seed of ``seeds`` on ``config`` (with
    ``overrides``, ``key=value``) into ``out_dir`` (default ``runs/compare-<config>``), and write
    the mean ± std table over seeds. Finished runs of the same config are reused and unfinished
    ones resume, so an interrupted comparison continues with the same call.

    ``select``: the round each run is read at, ``final`` or ``best`` (on validation).
    ``test_against``: one of ``methods``; each other method is tested against it on
    ``evaluation.best_metric``, paired by (seed, client) (:mod:`fedwear.reproduce.seed_test`), and
    the table gives each test's difference, interval and p-value. ``jobs`` runs in parallel
    (processes; each gets ``cores / jobs`` threads unless the config sets ``threads``);
    ``executor`` ``ray`` (at ``address``) or ``slurm`` (``slurm``'s options) run them on a cluster
    (docs/clusters.md). ``on_done(status)`` hears of each run as it finishes. ``cost``: the table
    ends with each method's on-device cost (:func:`fedwear.export.cost_section`; its first seed's
    run, exported into the run's ``export/``)."""
    from fedwear.compare import run_grid
    from fedwear.methods import METHODS, unknown_method
    from fedwear.privacy import privacy_section
    from fedwear.report.tables import comparison_table

    if select not in ("final", "best"):
        raise FedwearError(f"select {select!r}: use final or best")
    names = list(methods)
    if not names:
        raise FedwearError("methods: give at least one method, e.g. fedavg,local")
    for name in names:
        if name not in METHODS:
            raise FedwearError(f"methods: {unknown_method(name)}")
    if test_against is not None and test_against not in names:
        raise FedwearError(f"test_against {test_against!r} is not one of the methods ({', '.join(names)}): "
                           "name the reference among them")
    base = load_config(config, list(overrides))
    root = Path(out_dir) if out_dir else Path("runs") / f"compare-{Path(config).stem}"
    if root.exists() and not root.is_dir():
        raise FedwearError(f"{root} is a file, not a folder: give a folder for the comparison")
    threads = None if jobs == 1 else max(1, (os.cpu_count() or 1) // jobs)
    runs = []
    for name in names:
        for seed in seeds:
            sets = [*overrides, f"method={name}", f"seed={seed}"]
            if threads and base.threads is None:
                sets.append(f"threads={threads}")
            runs.append((name, load_config(config, sets), root / f"{name}-s{seed}"))  # all validated first
    with RunLock(root):  # a second comparison into this folder is refused before it starts anything
        done = run_grid(runs, jobs, overwrite, quiet, on_done=on_done, executor=executor, address=address,
                        slurm=slurm)
        summaries = {name: [done[where] for n, _, where in runs if n == name] for name in names}
        tests = None
        if test_against is not None:
            from fedwear.reproduce.claims import tests_against

            tests = tests_against({name: [(done[where], where) for n, _, where in runs if n == name]
                                   for name in names}, test_against, select, base)
        md, frame = comparison_table(summaries, select, base, tests)
        if (private := privacy_section(summaries)) is not None:
            md += "\n\n" + private
        if cost:
            from fedwear.export import cost_section

            md += "\n\n" + cost_section({name: root / f"{name}-s{seeds[0]}" for name in names})
        (root / files.TABLE_MD).write_text(md + "\n")
        frame.to_csv(root / files.TABLE_CSV, index=False)
    return Comparison(root, frame, md, summaries)


def report(path: str | Path, out_dir: str | Path | None = None, fmt: str = "png", **options) -> Path:
    """Write the report of a run or comparison folder (``out_dir``, default ``path/report``): the
    figures (PNG at 300 dpi; ``fmt`` ``pdf`` or ``svg`` adds each as that vector file) and one
    self-contained ``index.html``, whose path it returns. ``options``: those of ``fedwear report``
    (``embeddings``, ``root``, ``forecast``, ``client``, ``tsne_windows``, ``reference``; ``command``: the
    command line the page names as its maker)."""
    from fedwear.report.build import write_report

    path = Path(path)
    return write_report(path, Path(out_dir) if out_dir else None, fmt=fmt, paper=paper_numbers(path), **options)


def _runs_dataset(path: Path) -> str | None:
    """``dataset.name`` of the run at ``path`` or of the first run folder under it (config.yaml)."""
    for cfg in [path / files.CONFIG, *sorted(path.glob(f"*/{files.CONFIG}"))]:
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
