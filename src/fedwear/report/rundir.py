"""Read a run directory (``fedwear run``) or a comparison directory (``fedwear compare``).

Every problem with the files becomes a :class:`~fedwear.errors.FedwearError` naming the path
and what to do, so the command line can print it as one line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pandas as pd
import yaml

from fedwear import files
from fedwear.config import flat_params, load_config
from fedwear.errors import ConfigError, FedwearError
from fedwear.rundir import RunFolder
from fedwear.summary import aggregate_metrics, build_summary, metric_columns, read_summary
from fedwear.version import __version__

REQUIRED = {
    files.METRICS: ["round", "client", "view", "split", "n"],
    files.ROUNDS: ["round", "bytes_down", "bytes_up", "train_loss"],
    files.TIMING: ["round", "wall_s"],
}
RUN_MARKERS = (files.CONFIG, files.METRICS, files.SUMMARY)
#: The pooled confusion counts of a classification run (``fedwear.callbacks.CONFUSION_FILE``;
#: run folders made before fedwear recorded it have none).
CONFUSION_COLUMNS = ["round", "view", "split", "true", "pred", "count"]
#: run.log's data line: ``data: <name>, <rate> Hz, window <w>, <Q> classes (<a>, <b>, ...); ...``
DATA_LINE = re.compile(r" INFO data: .*?, window \d+, (\d+) classes \((.*)\); \d+ training clients")
#: Numeric columns of metrics.csv that count windows, not metrics (``n`` is an id column).
COUNTS = ("n_train",)


@dataclass
class Run:
    """One run directory: its config, CSV tables and summary."""

    path: Path
    config: dict
    summary: dict
    metrics: pd.DataFrame
    rounds: pd.DataFrame
    timing: pd.DataFrame

    @property
    def method(self) -> str:
        """The method from summary.json, else from config.yaml."""
        return str(self.summary.get("method") or self.config.get("method") or "?")

    @property
    def name(self) -> str:
        """The variant the run belongs to: its folder's name without the ``-s<seed>`` ending, as
        ``fedwear compare`` and ``reproduce`` name folders (``pcfedh-no_cre`` for
        ``pcfedh-no_cre-s0``: a method's variants stay apart), else the method."""
        stem, sep, seed = self.path.name.rpartition("-s")
        return stem if stem and sep and seed == str(self.seed) else self.method

    @property
    def seed(self) -> int | str:
        """The seed from summary.json, else from config.yaml."""
        seed = self.summary.get("seed", self.config.get("seed"))
        return seed if seed is not None else "?"

    @property
    def unfinished(self) -> bool:
        """No summary.json yet: the summary was built from the CSV files written so far."""
        return bool(self.summary.get("unfinished"))

    @property
    def evaluated(self) -> bool:
        """Whether metrics.csv holds any evaluated round (a run stopped before its first
        evaluation has the header only)."""
        return len(self.metrics) > 0

    @property
    def stopped_at(self) -> str:
        """``stopped at round R of N`` for an unfinished run (R: the last round in rounds.csv)."""
        planned = self.summary["rounds_planned"]
        if not len(self.rounds):
            return f"stopped before round 1 of {planned} ended"
        return f"stopped at round {self.summary['rounds_run']} of {planned}"

    @property
    def label(self) -> str:
        unfinished = f" (unfinished: {self.stopped_at})" if self.unfinished else ""
        return f"{self.name} seed {self.seed}{unfinished}"

    @property
    def log(self) -> str:
        """run.log ('' when it is missing or unreadable)."""
        try:
            return (self.path / files.LOG).read_text(errors="replace")
        except OSError:
            return ""

    @property
    def log_end(self) -> str | None:
        """The last line of run.log when it records how the run ended (``end: paused at round 2
        of 6 ...``), without its timestamp; None when run.log is missing or records no end (the
        run is still going, or was killed)."""
        lines = self.log.splitlines()
        _, sep, text = (lines[-1] if lines else "").partition(" INFO end: ")
        return f"end: {text}" if sep else None

    @cached_property
    def metric_names(self) -> list[str]:
        """Numeric columns of metrics.csv other than round, the id columns and the window
        counts (n, n_train)."""
        return [m for m in metric_columns(self.metrics) if m not in COUNTS]

    @property
    def client_weights(self) -> str:
        """``evaluation.client_weights`` of the run (test windows for runs that predate it)."""
        return str((self.config.get("evaluation") or {}).get("client_weights", "test"))

    @cached_property
    def confusion(self) -> pd.DataFrame | None:
        """confusion.csv (round, view, split, true, pred, count: the windows of class ``true``
        predicted as ``pred``, summed over the clients), None when the run folder has none (made
        before fedwear recorded it, or a regression run); an unfinished run's up to the last
        round of rounds.csv."""
        path = self.path / files.CONFUSION
        if not path.is_file():
            return None
        frame = RunFolder(self.path).table(files.CONFUSION, CONFUSION_COLUMNS)
        if self.unfinished:
            last = self.rounds["round"].max() if len(self.rounds) else -1
            frame = frame[frame["round"] <= last]
        return frame.astype({"view": str, "split": str})

    @cached_property
    def class_names(self) -> list[str] | None:
        """The class names in index order, from run.log's data line (None when run.log is missing
        or does not name them unambiguously)."""
        found = DATA_LINE.search(self.log)
        if not found:
            return None
        names = found.group(2).split(", ")
        return names if len(names) == int(found.group(1)) else None

    @cached_property
    def settings(self) -> dict[str, str] | None:
        """The settings that decide the run's numbers (:meth:`fedwear.config.RunConfig.settings`)
        but its seed, as dotted keys and text values; None when config.yaml is missing or does
        not validate."""
        try:
            tree = load_config(self.path / files.CONFIG).settings()
        except ConfigError:
            return None
        tree.pop("seed", None)
        return flat_params(tree)

    @property
    def final_round(self) -> int | None:
        """The last evaluated round (None before the first evaluation)."""
        final = self.summary.get("final_round")
        return int(final) if self.evaluated and final is not None else None

    @cached_property
    def aggregated(self) -> pd.DataFrame:
        """:func:`fedwear.summary.aggregate_metrics` of metrics.csv, with the run's client weights."""
        return aggregate_metrics(self.metrics, self.client_weights)


@dataclass
class Comparison:
    """A comparison directory: runs grouped by method (in folder order), seeds sorted."""

    path: Path
    runs: dict[str, list[Run]] = field(default_factory=dict)

    @property
    def all_runs(self) -> list[Run]:
        return [r for runs in self.runs.values() for r in runs]


def unlike_seeds(groups: dict[str, list[Run]]) -> list[str]:
    """Where the seeds of one method are not alike, so that their mean mixes settings or budgets:
    for each method, the settings (seed aside) that differ between its runs and, when they differ,
    the rounds its runs are read at (their final evaluated round), as ``method: key: value
    (seeds 1, 2), other value (seed 3)``."""
    found = []
    for name, runs in groups.items():
        if len(runs) < 2:
            continue
        trees = [r.settings for r in runs]
        if all(t is not None for t in trees):
            for key in sorted(set().union(*trees)):
                values = {r.seed: trees[i].get(key, "default") for i, r in enumerate(runs)}
                if len(set(values.values())) > 1:
                    found.append(f"{name}: {key}: {_by_value(values)}")
        rounds = {r.seed: r.final_round for r in runs if r.final_round is not None}
        if len(set(rounds.values())) > 1:
            found.append(f"{name}: read at round {_by_value(rounds)}")
    return found


def _by_value(values: dict) -> str:
    """``{1: a, 2: b, 3: b}`` as ``a (seed 1), b (seeds 2, 3)``."""
    seeds: dict[str, list[str]] = {}
    for seed, value in values.items():
        seeds.setdefault(str(value), []).append(str(seed))
    return ", ".join(f"{v} (seed{'s' if len(ss) > 1 else ''} {', '.join(ss)})" for v, ss in seeds.items())


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds any of a run directory's files."""
    return any((path / name).is_file() for name in RUN_MARKERS)


def load(path: Path) -> Run | Comparison:
    """The run or comparison stored at ``path``."""
    path = Path(path)
    if not path.exists():
        raise FedwearError(f"{path} does not exist: pass a run directory (from `fedwear run`) "
                           "or a comparison directory (from `fedwear compare`)")
    if not path.is_dir():
        raise FedwearError(f"{path} is a file: pass the folder that holds metrics.csv and "
                           "summary.json (a run directory) or the <method>-s<seed> folders "
                           "(a comparison directory)")
    if is_run_dir(path):
        return load_run(path)
    if subdirs := sorted(p for p in path.iterdir() if p.is_dir() and is_run_dir(p)):
        return load_comparison(path, subdirs)
    raise FedwearError(
        f"{path} is neither a run directory (config.yaml, metrics.csv, summary.json written by "
        "`fedwear run`) nor a comparison directory (<method>-s<seed>/ run folders written by "
        "`fedwear compare`): pass one of those"
    )


def load_run(path: Path) -> Run:
    """Read and check one run directory. A run still going (or stopped before its end: no
    summary.json, but its config.yaml) is read as far as it got, its summary built from the
    CSV files as ``fedwear run`` builds it at the end, marked ``unfinished``: up to the last
    round of rounds.csv (a line torn by a kill is left out), and with no row in metrics.csv
    when it stopped before its first evaluation."""
    unfinished = not (path / files.SUMMARY).is_file() and (path / files.CONFIG).is_file()
    summary = {} if unfinished else _read_summary(path / files.SUMMARY)
    folder = RunFolder(path)
    frames = {name: folder.table(name, cols) for name, cols in REQUIRED.items()}
    if unfinished:  # rows of a round whose rounds.csv line was never written are not that far yet
        last = frames[files.ROUNDS]["round"].max() if len(frames[files.ROUNDS]) else -1
        frames = {name: f[f["round"] <= last] for name, f in frames.items()}
    metrics = frames[files.METRICS]
    if not metric_columns(metrics):
        raise FedwearError(f"{path / files.METRICS}: no numeric metric column (e.g. accuracy); "
                           "the file is damaged: rerun the experiment with `fedwear run`")
    if len(metrics) and not (metrics["split"] == "test").any():
        raise FedwearError(f"{path / files.METRICS}: no rows on the test split; "
                           "rerun the experiment with `fedwear run`")
    if unfinished:
        summary = _provisional_summary(path, metrics, frames[files.ROUNDS], frames[files.TIMING])
    return Run(path, _read_config(path / files.CONFIG), summary, metrics,
               frames[files.ROUNDS], frames[files.TIMING])


def _provisional_summary(path: Path, metrics: pd.DataFrame, rounds: pd.DataFrame, timing: pd.DataFrame) -> dict:
    try:
        cfg = load_config(path / files.CONFIG)
    except ConfigError as e:
        raise FedwearError(f"{path / files.SUMMARY} is missing (the run did not finish) and {e}") from None
    summary = build_summary(cfg, metrics, rounds, float(timing["wall_s"].sum()), __version__)
    return {**summary, "seed": cfg.seed, "unfinished": True,
            "rounds_run": int(rounds["round"].max()) if len(rounds) else 0, "rounds_planned": cfg.rounds}


def load_comparison(path: Path, subdirs: list[Path]) -> Comparison:
    """Read every run folder of a comparison and group the runs by :attr:`Run.name`: in the order
    of ``fedwear compare``'s ``--methods`` (the rows of its table.csv) when the folder has that
    table, else in folder order, seeds sorted."""
    cmp = Comparison(path)
    for sub in subdirs:
        run = load_run(sub)
        cmp.runs.setdefault(run.name, []).append(run)
    order = _table_order(path / files.TABLE_CSV)
    ranked = sorted(cmp.runs, key=lambda m: (order.index(m) if m in order else len(order)))
    cmp.runs = {m: sorted(cmp.runs[m], key=_seed_order) for m in ranked}
    return cmp


def _table_order(table: Path) -> list[str]:
    """The methods of a comparison's table.csv in row order ([] without a readable one)."""
    try:
        frame = pd.read_csv(table)
    except (OSError, ValueError, pd.errors.ParserError, UnicodeDecodeError):
        return []
    return list(dict.fromkeys(str(m) for m in frame["method"])) if "method" in frame else []


def _seed_order(run: Run) -> tuple[int, int, str]:
    """Integer seeds in order, then any others by name."""
    return (0, run.seed, "") if isinstance(run.seed, int) else (1, 0, str(run.seed))


def _read_summary(path: Path) -> dict:
    if not path.is_file():
        raise FedwearError(f"{path} is missing (the run did not finish); finish it with "
                           "`fedwear run <config> --out <run dir> --resume`")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise FedwearError(f"{path} is not readable JSON ({type(e).__name__}); "
                           "rerun the experiment with `fedwear run`") from None
    return read_summary(data, path)


def _read_config(path: Path) -> dict:
    """config.yaml as a plain mapping (only for labels), empty when absent or unreadable."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}
