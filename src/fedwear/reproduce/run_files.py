"""A run folder's files as the results writers read them, and the cells they write over seeds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import yaml

from fedwear import files
from fedwear.config import RunConfig
from fedwear.errors import ConfigError
from fedwear.rundir import RunFolder
from fedwear.version import __version__

if TYPE_CHECKING:
    from fedwear.reproduce import Experiment


def matching_metrics(cfg: RunConfig, where: Path, at_round: int | None = None) -> pd.DataFrame | None:
    """``where``'s ``metrics.csv`` when the folder holds a run of ``cfg`` (same config hash) with at
    least one evaluated round (up to ``at_round`` when given: the run as it stood then); None when
    it was not run yet or is a run of another config."""
    if not (where / files.METRICS).exists() or not (where / files.CONFIG).exists() \
            or RunFolder(where).of_another_config(cfg):
        return None
    metrics = RunFolder(where).table(files.METRICS, at_round=at_round)
    return None if metrics.empty else metrics


def runs_cells(method: str, got: list[dict], runs: list[tuple[str, RunConfig, Path]],
               at_round: int | None = None) -> str:
    """A results row's "seeds | rounds run": the seeds of the runs shown (``-`` without any), and
    each one's rounds / planned, or "not run"; the seeds left out are named: runs still short of
    ``at_round`` (as :func:`numbers_by_method` leaves them out) and runs of an earlier config of
    the table (compared with nothing)."""
    short, earlier = [], []
    for m, cfg, where in runs:
        if m != method:
            continue
        if RunFolder(where).of_another_config(cfg):
            earlier.append(f"s{cfg.seed}")
        elif at_round is not None and short_of(where, at_round) and (done := rounds_run(where)) > 0:
            short.append(f"s{cfg.seed}: {done}/{cfg.rounds}")
    seeds = ",".join(str(n["seed"]) for n in got) or "-"
    rounds = ", ".join(f"{n['rounds']}/{n['of']}" for n in got) or ("none shown" if short else "not run")
    notes = [f"{', '.join(short)}, short of round {at_round}"] if short else []
    notes += [f"{', '.join(earlier)}: runs of an earlier config, rerun with --overwrite"] if earlier else []
    return f"{seeds} | {rounds}" + (f" ({'; '.join(notes)})" if notes else "")


def short_of(where: Path, at_round: int) -> bool:
    """Whether an unfinished run has not reached ``at_round`` yet (its numbers would be of a
    smaller budget than the other rows')."""
    return not RunFolder(where).finished and rounds_run(where) < at_round


def table_progress(runs: list[tuple[str, RunConfig, Path]]) -> str:
    """How far a table's runs got: finished runs, and rounds done out of all rounds planned (an
    unfinished run's: the last round its ``timing.csv`` records, 0 when it has not started)."""
    folders = [(cfg, RunFolder(where)) for _, cfg, where in runs]
    finished = sum(folder.finished for _, folder in folders)
    done = sum(cfg.rounds if folder.finished else int(max(folder.timing().get("round", []), default=0))
               for cfg, folder in folders)
    planned = sum(cfg.rounds for _, cfg, _ in runs)
    return f"{finished}/{len(runs)} runs finished, {done}/{planned} rounds"


def rounds_run(where: Path, at_round: int | None = None) -> int:
    """The last round in a run folder's ``rounds.csv`` (0 when none), or ``at_round`` if that is earlier."""
    last = RunFolder(where).last_round()
    return last if at_round is None else min(last, at_round)


def numbers_by_method(runs: list[tuple[str, RunConfig, Path]], methods: tuple[str, ...],
                      read: Callable[[RunConfig, Path, int | None], dict | None],
                      at_round: int | None = None) -> dict[str, list[dict]]:
    """Method -> what ``read`` makes of each of its runs that has numbers yet (each as it stood at
    ``at_round`` when given; an unfinished run that has not reached it yet is left out, as its
    numbers would be of a smaller budget), in the order of ``runs``."""
    by_method: dict[str, list[dict]] = {m: [] for m in methods}
    for method, cfg, where in runs:
        by_method.setdefault(method, [])
        if (at_round is None or not short_of(where, at_round)) and (nums := read(cfg, where, at_round)) is not None:
            by_method[method].append(nums)
    return by_method


#: What a notes file may hold (:func:`with_notes`), as the :class:`Experiment` fields they fill.
NOTES = {"protocol": "notes", "variants": "variants", "differences": "differences", "flagged": "flagged"}


def with_notes(exp: Experiment, results: Path) -> Experiment:
    """``exp`` with the prose of the results file at ``results``, read from its notes file,
    ``notes/<its name>.yaml`` in its folder: the protocol, each row's implementation, the known
    differences from the authors' run and the findings of flagged rows. Unchanged where there is
    no such file (fedwear installed without the repository, or a results file written elsewhere)."""
    path = results.parent / "notes" / f"{results.stem}.yaml"
    if not path.is_file():
        return exp
    notes = yaml.safe_load(path.read_text()) or {}
    if not isinstance(notes, dict) or set(notes) - set(NOTES):
        raise ConfigError(f"{path}: a notes file is a mapping of {', '.join(NOTES)}")
    return replace(exp, **{NOTES[k]: tuple(v) if k == "differences" else v for k, v in notes.items()})


def header(exp: Experiment, command: str, out: Path, at_round: int | None = None) -> list[str]:
    """A results file's opening lines: title, the command that made the runs, protocol, and the
    known differences from a run of the authors' code."""
    return [
        f"# {exp.title}", "",
        f"Produced by `{command}` (fedwear {__version__}); run folders in `{out}`.", "",
        *([f"Every row as its run stood at round {at_round} (`--at-round`): later rounds are left out, "
           "so rows that ran further are compared at the same budget, and runs still short of it are not "
           "shown yet.", ""] if at_round else []),
        *([f"Protocol: {exp.notes}.", ""] if exp.notes else []),
        *([f"Known differences from a run of the authors' code: {'; '.join(exp.differences)}.", ""]
          if exp.differences else []),
        "CPU times are each run's own (its timing.csv), measured on the machine and under the load it ran "
        "with: rows made on different machines differ by 2x or more for the same work, so compare "
        "them with care; benchmarks/ compares speed side by side in one run.", "",
    ]


def findings(exp: Experiment, warned: set[str]) -> list[str]:
    """The investigation of the flagged rows: one bullet per finding of ``exp.flagged``, naming
    every method with a ⚠ in its row (``warned``) that the finding explains."""
    by_finding: dict[str, list[str]] = {}
    for m in exp.methods:
        if m in exp.flagged and m in warned:
            by_finding.setdefault(exp.flagged[m], []).append(m)
    if not by_finding:
        return []
    return ["", "Rows flagged ⚠: what their investigation found (open: not explained yet):", "",
            *(f"- **{', '.join(methods)}**: {finding}." for finding, methods in by_finding.items())]


#: A row is flagged where ours and the paper's differ by more than this (points).
FLAG = 2.0


def _present(values: list[float | None]) -> np.ndarray:
    """``values`` without the missing ones (None, NaN)."""
    v = np.array([x for x in values if x is not None], float)
    return v[~np.isnan(v)]


def delta_cell(ours: list[float | None], paper: float | None) -> str:
    """Ours (mean over seeds) minus the paper's, ⚠ past ``FLAG`` points; empty without both."""
    v = _present(ours)
    if paper is None or not len(v):
        return ""
    d = v.mean() - paper
    return f"{d:+.2f}" + (" ⚠" if abs(d) > FLAG else "")


def seed_cell(values: list[float | None]) -> str:
    """A results cell over seeds: the mean, ± population std when there are several; missing
    (None, NaN) values left out, ``n/a`` when none is left."""
    v = _present(values)
    if not len(v):
        return "n/a"
    return f"{v.mean():.2f}" if len(v) == 1 else f"{v.mean():.2f} ± {v.std():.2f}"


def cpu_cell(values: list[float | None]) -> str:
    """The mean of the runs' CPU seconds, whole; empty when none has one."""
    v = _present(values)
    return f"{v.mean():.0f}" if len(v) else ""


def pm_cell(cells: list[tuple[float, float]], digits: int) -> str:
    """Mean ± std over clients, each averaged over the runs (seeds) in ``cells``; ``n/a`` without runs."""
    if not cells:
        return "n/a"
    return f"{np.mean([c[0] for c in cells]):.{digits}f} ± {np.mean([c[1] for c in cells]):.{digits}f}"


def context_section(paper: dict) -> list[str]:
    """A paper's own table, for context: measured on other datasets than the runs (its
    ``source`` names them), so no difference is computed."""
    cols = paper["columns"]
    return ["", f"## The paper's numbers, for context ({paper['source']})", "",
            f"They were measured on other datasets ({paper['datasets']}), so no difference is computed.", "",
            "| Method | " + " | ".join(cols) + " |", "|" + "---|" * (1 + len(cols)),
            *(f"| {method} | " + " | ".join("N/A" if v is None else str(v) for v in row) + " |"
              for method, row in paper["rows"].items())]
