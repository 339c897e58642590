"""What the server accepts of a client's evaluation rows.

Under every engine the clients compute their own metrics; in a Flower deployment they are
other machines, and a row is whatever a node sent. The round loop keeps a client's rows of a
round only when every one of them could have been computed from that client's data:

- each view and split is one the run evaluates, once, from the right kind of client
  (``new_clients`` views from held-out clients only, ``global_pooled`` from one client a round);
- ``n`` and ``n_train`` are the windows that client declared for that split (the pooled test
  set's for ``generalization`` and ``global_pooled``), where the server knows them;
- the task's metrics, and only those, are numbers in their range (accuracy, macro-F1 and AUC in
  [0, 1]; MSE, MAE and MAPE >= 0, inf for a diverged model; NaN where undefined);
- a classification row's confusion counts are ``num_classes**2`` whole numbers >= 0 summing to
  ``n``, and its accuracy and macro-F1 are the ones those counts give; a regression row's MSE is
  at least its MAE squared.

A client whose rows fail is left out of that round's metrics (``rejected`` in rounds.csv names
it and why), never averaged. These checks bound what a lying node can claim, not whether its
predictions were real: a deployment's numbers are its nodes' own reports (summary.json says so).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from fedwear.config import KIND_METRICS, RunConfig
from fedwear.engines.client import CONFUSION, whole_number
from fedwear.evaluation.metrics import METRIC_RANGE, impossible_value, per_class_f1
from fedwear.evaluation.naive import NAIVE

#: Where a recomputed accuracy or macro-F1 may differ from the reported one (float rounding).
TOLERANCE = 1e-9
#: Views computed on the pooled test set of every training client (its ``n``).
POOLED_VIEWS = ("generalization", "global_pooled")
SPLITS = ("train", "test", "val")


@dataclass(frozen=True)
class RowRules:
    """What one run's evaluation rows may contain."""

    kind: str
    num_classes: int
    views: frozenset[str]  # base views a training client may report (new clients: new_clients)
    budgets: tuple[str, ...]
    splits: frozenset[str]
    #: Each evaluated client's declared (train, test, val) windows; clients not in it are not size-checked.
    sizes: dict[str, tuple[int, int, int]]
    pooled_test: int | None  # windows of the pooled test set (None: not known)

    @staticmethod
    def of(cfg: RunConfig, kind: str, num_classes: int, budgets: Iterable[str],
           sizes: dict[str, tuple[int, int, int]], clients: Iterable[str]) -> RowRules:
        ev = cfg.evaluation
        views = set(ev.views) | (set(NAIVE) if kind == "regression" and "personalized" in ev.views else set())
        clients = list(clients)
        pooled = sum(sizes[c][1] for c in clients) if all(c in sizes for c in clients) else None
        return RowRules(kind, num_classes, frozenset(views), tuple(budgets),
                        frozenset(["test", "val"] if ev.best_split == "val" else ["test"]), dict(sizes), pooled)


def _shown(v: object) -> str:
    """A client's text as a reason may quote it: short, and without rounds.csv's separators."""
    text = repr(v)
    return (text if len(text) <= 40 else text[:37] + "...").replace(";", ",").replace(":", ".")


def rows_problem(rows: list[dict], client: str, new: bool, rules: RowRules, pooled_seen: set[str]) -> str | None:
    """Why ``client``'s evaluation rows of one round cannot be kept, or None. ``new``: a held-out
    client. ``pooled_seen``: the splits of this round's ``global_pooled`` rows already kept (a
    second one is refused; the caller adds a kept row's split)."""
    seen: set[tuple[str, str]] = set()
    for row in rows:
        view, split = row.get("view"), row.get("split")
        where = f"row {_shown(view)}/{_shown(split)}"
        if not isinstance(view, str) or not isinstance(split, str):
            return f"{where}: view and split must be text"
        base, _, budget = view.partition("@")
        allowed = {"new_clients"} if new else rules.views - {"new_clients"}
        if base not in allowed or (budget and budget not in rules.budgets) or split not in rules.splits:
            return f"{where}: not a view and split this run evaluates for {'a new' if new else 'a training'} client"
        if (view, split) in seen or (base == "global_pooled" and split in pooled_seen):
            return f"{where}: reported twice"
        seen.add((view, split))
        why = _row_problem(row, client, base, split, rules)
        if why:
            return f"{where}: {why}"
    return None


def _row_problem(row: dict, client: str, base: str, split: str, rules: RowRules) -> str | None:
    n, n_train = whole_number(row.get("n")), whole_number(row.get("n_train"))
    if n is None or n < 0 or n_train is None or n_train < 0:
        return f"n={row.get('n')!r}, n_train={row.get('n_train')!r}: not whole numbers >= 0"
    declared = rules.sizes.get(client)
    want_n = rules.pooled_test if base in POOLED_VIEWS else (declared[SPLITS.index(split)] if declared else None)
    want_train = 0 if base == "global_pooled" else (declared[0] if declared else None)
    if want_n is not None and n != want_n:
        return f"n={n}, but the client's {split} split has {want_n} windows"
    if want_train is not None and n_train != want_train:
        return f"n_train={n_train}, but the client has {want_train} train windows"
    metrics = KIND_METRICS[rules.kind]
    extra = set(row) - {"view", "split", "n", "n_train", CONFUSION, *metrics}
    if extra or any(m not in row for m in metrics):
        return f"metrics {sorted(set(row) - {'view', 'split', 'n', 'n_train', CONFUSION})}, expected {list(metrics)}"
    values = {}
    for m in metrics:
        v = row[m]
        if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
            return f"{m}={v!r}: not a number"
        if impossible_value(m, v):
            return f"{m}={v!r}: outside [{METRIC_RANGE[m][0]:g}, {METRIC_RANGE[m][1]:g}]"
        values[m] = float(v)
    if rules.kind == "classification":
        return _confusion_problem(row.get(CONFUSION), n, values, rules.num_classes)
    if CONFUSION in row:
        return "confusion counts in a regression row"
    if n and not math.isnan(values["mse"]) and values["mse"] < values["mae"] ** 2 * (1 - TOLERANCE):
        return f"mse={values['mse']!r} below mae squared ({values['mae'] ** 2!r}): impossible"
    return None


def _confusion_problem(cells: object, n: int, values: dict[str, float], q: int) -> str | None:
    if not isinstance(cells, tuple | list) or len(cells) != q * q:
        return f"confusion counts: expected {q * q} (num_classes squared)"
    counts = [whole_number(c) for c in cells]
    if any(c is None or c < 0 for c in counts):
        return "confusion counts: not whole numbers >= 0"
    matrix = np.asarray(counts, np.int64).reshape(q, q)
    if int(matrix.sum()) != n:
        return f"confusion counts sum to {int(matrix.sum())}, not n={n}"
    if n == 0:
        return None if all(math.isnan(v) for v in values.values()) else "metrics of an empty split must be NaN"
    accuracy = float(np.trace(matrix)) / n
    f1 = float(np.nanmean(per_class_f1(matrix)))
    for name, want in (("accuracy", accuracy), ("macro_f1", f1)):
        if not abs(values[name] - want) <= TOLERANCE:
            return f"{name}={values[name]!r}, but its confusion counts give {want!r}"
    return None
