"""Per-class figures of a classification comparison, from each run's ``confusion.csv`` (the
windows of each true class predicted as each class, summed over clients, per evaluated round x
view x split): a row-normalised confusion matrix per method and the per-class F1 per method, for
the personalized and new-clients views (a method with fine-tuning budgets: its last budget,
``personalized@n3``), at each seed's final round.

Run folders made before fedwear recorded the counts have no ``confusion.csv``: their methods are
left out, and the section says so. Regression runs have no classes and no such figures.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from fedwear.config import METRICS
from fedwear.evaluation.metrics import per_class_f1
from fedwear.report.plots import Groups, Plot, _new_figure, _save, colors, flat, n_seeds, set_range
from fedwear.report.rundir import CONFUSION_COLUMNS, Run
from fedwear.report.style import fit_tick_labels
from fedwear.report.tables import ordered_views

#: The views drawn (HAR papers' figure: the clients' own models, and new clients after adaptation).
BASES = ("personalized", "new_clients")
NO_FILE = "no confusion.csv (run made before fedwear recorded it)"
#: Up to this many classes, each cell of a confusion matrix prints its percentage.
ANNOTATE_MAX = 12


def is_classification(run: Run) -> bool:
    """Whether the run's metrics are classification metrics (accuracy, macro-F1, AUC)."""
    return any(m in METRICS for m in run.metric_names)


def _final_cells(run: Run) -> pd.DataFrame:
    """The test-split rows of confusion.csv at the run's final round (none without the file)."""
    c, final = run.confusion, run.summary.get("final_round")
    if c is None or final is None:
        return pd.DataFrame(columns=CONFUSION_COLUMNS)
    return c[(c["round"] == final) & (c["split"] == "test")]


def view_for(runs: list[Run], base: str) -> str | None:
    """The view of ``base`` the runs' confusion.csv holds at their final round: ``base`` itself,
    else its last fine-tuning budget (``personalized@n3``); None when neither."""
    present = {v for run in runs for v in _final_cells(run)["view"].unique()}
    if base in present:
        return base
    budgets = [v for v in ordered_views(present) if v.startswith(base + "@")]
    return budgets[-1] if budgets else None


def run_matrix(run: Run, view: str, q: int) -> np.ndarray | None:
    """The ``[q, q]`` counts (rows: true class, columns: predicted) of ``view`` on the test split
    at the run's final round, summed over its clients; None when confusion.csv has none."""
    cells = _final_cells(run)
    sel = cells[cells["view"] == view]
    if not len(sel):
        return None
    m = np.zeros((q, q), np.int64)
    np.add.at(m, (sel["true"].to_numpy(int), sel["pred"].to_numpy(int)), sel["count"].to_numpy(np.int64))
    return m


def class_labels(runs: list[Run]) -> list[str]:
    """Class names from run.log (the first run that names them), else the class indices of
    confusion.csv (0 .. the largest index seen)."""
    for run in runs:
        if run.class_names:
            return run.class_names
    top = max((int(max(c["true"].max(), c["pred"].max())) for r in runs
               if (c := r.confusion) is not None and len(c)), default=-1)
    return [str(i) for i in range(top + 1)]


def runs_text(runs: list[Run]) -> str:
    """``fedavg seeds 0, 1; local seed 0`` (unfinished runs say so)."""
    by: dict[str, list[str]] = {}
    for r in runs:
        by.setdefault(r.name, []).append(str(r.seed) + (" (unfinished)" if r.unfinished else ""))
    return "; ".join(f"{m} seed{'s' if len(s) > 1 else ''} {', '.join(s)}" for m, s in by.items())


def missing_confusion(groups: Groups) -> list[Run]:
    """The classification runs without a confusion.csv."""
    return [r for r in flat(groups) if is_classification(r) and r.confusion is None]


def classification_plots(groups: Groups, out: Path) -> tuple[list[Plot], str | None]:
    """``confusion-<view>.png`` and ``f1-<view>.png`` for the personalized and new-clients views,
    and a sentence naming the runs left out for want of a confusion.csv (None when none is)."""
    runs = [r for r in flat(groups) if is_classification(r)]
    if not runs:
        return [], None
    missing = missing_confusion(groups)
    note = f"{NO_FILE}: {runs_text(missing)}; rerun them to get these figures" if missing else None
    names = class_labels(runs)
    if not names:
        return [], note
    q = len(names)
    plots: list[Plot] = []
    for base in BASES:
        chosen: dict[str, tuple[str, list[np.ndarray], list[Run]]] = {}
        for method, rs in groups.items():
            view = view_for(rs, base)
            if view is None:
                continue
            pairs = [(r, m) for r in rs if (m := run_matrix(r, view, q)) is not None]
            if pairs:
                chosen[method] = (view, [m for _, m in pairs], [r for r, _ in pairs])
        if chosen:
            plots.append(_confusion_plot(base, chosen, names, out, note))
            plots.append(_f1_plot(base, chosen, names, groups, out, note))
    return plots, note


def _used(chosen: dict[str, tuple[str, list[np.ndarray], list[Run]]], note: str | None) -> str:
    """The caption's runs drawn and, after ``note``, those left out."""
    runs = "; ".join(f"{m}: {view}, seed{'s' if len(rs) > 1 else ''} {', '.join(str(r.seed) for r in rs)}"
                     f" (round {', '.join(sorted({str(r.summary.get('final_round')) for r in rs}))})"
                     for m, (view, _, rs) in chosen.items())
    return f"Runs: {runs}." + (f" Left out: {note}." if note else "")


def _confusion_plot(base: str, chosen: dict, names: list[str], out: Path, note: str | None) -> Plot:
    """One row-normalised matrix per method, pooled over clients and seeds, on a fixed 0-100 %
    colour scale."""
    q, n = len(names), len(chosen)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    cell = max(2.8, 0.3 * q + 1.5)
    fig = _new_figure(0.9 + cell * ncols, 0.5 + (cell + 0.5) * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="#e8e8e8")
    image = None
    font = 7 if q <= 8 else 6 if q <= 12 else 5
    for ax, (method, (view, mats, rs)) in zip(axes, chosen.items(), strict=False):
        total = np.sum(mats, axis=0)
        rows = total.sum(1, keepdims=True)
        pct = np.where(rows > 0, 100.0 * total / np.maximum(rows, 1), np.nan)
        image = ax.imshow(np.ma.masked_invalid(pct), cmap=cmap, vmin=0, vmax=100)
        if q <= ANNOTATE_MAX:
            for t, p in zip(*np.nonzero(~np.isnan(pct)), strict=True):
                ax.text(p, t, f"{pct[t, p]:.0f}", ha="center", va="center", fontsize=font,
                        color="white" if pct[t, p] > 55 else "black")
        ax.set_xticks(range(q), names, rotation=90, fontsize=font + 0.5)
        ax.set_yticks(range(q), names, fontsize=font + 0.5)
        ax.set(xlabel="predicted class", ylabel="true class",
               title=f"{method}: {view}\n{int(total.sum())} windows, {n_seeds(len(rs))}")
    for ax in axes[n:]:
        ax.set_axis_off()
    if image is not None:
        fig.colorbar(image, ax=axes.tolist(), shrink=0.7, label="% of the true class's windows")
    file = f"confusion-{base}.png"
    _save(fig, out, file)
    caption = (f"Confusion matrices, {base} view (a method with fine-tuning budgets: its last budget), test "
               "split, at each seed's final round, from confusion.csv: each cell counts the windows of the "
               "true class (row) predicted as the class (column), summed over all clients and over the seeds, "
               "then each row divided by its total (rows sum to 100 %; grey: a class with no test window). "
               f"Colour scale fixed at 0-100 %. {_used(chosen, note)}")
    short = (f"Confusion matrices, {base} view, test split, pooled over clients and seeds; each row (true class) "
             "sums to 100 %.")
    return Plot(file, f"confusion: {base}", short, "classes", notes=caption)


def _f1_plot(base: str, chosen: dict, names: list[str], groups: Groups, out: Path, note: str | None) -> Plot:
    """Per-class F1 (%) per method: the mean over seeds of each seed's F1 from its pooled
    counts, each seed a dot, on a fixed 0-100 % axis."""
    q, k = len(names), len(chosen)
    col = colors(groups)
    width = 0.8 / k
    fig = _new_figure(min(18.0, max(6.0, 1.2 + q * (0.25 + 0.22 * k))), 4.2)
    ax = fig.add_subplot()
    labels = []
    for i, (method, (view, mats, _)) in enumerate(chosen.items()):
        f1 = np.array([100.0 * per_class_f1(m) for m in mats])  # seeds x classes, NaN: no window either way
        counted = (~np.isnan(f1)).sum(0)
        mean = np.where(counted > 0, np.nansum(f1, axis=0) / np.maximum(counted, 1), np.nan)
        x = np.arange(q) + (i - (k - 1) / 2) * width
        ok = ~np.isnan(mean)
        ax.bar(x[ok], mean[ok], width=width * 0.92, color=col[method], alpha=0.85, zorder=2)
        if len(mats) > 1:
            for s in f1:
                good = ~np.isnan(s)
                ax.scatter(x[good], s[good], s=8, color="white", edgecolor="black", lw=0.6, zorder=3)
        macro = float(np.mean(mean[ok])) if ok.any() else float("nan")
        labels.append(f"{method} ({view}; mean over classes {macro:.1f})")
    set_range(ax, 0.0, 100.0)
    ax.set_xticks(range(q), names)
    ax.set(xlim=(-0.6, q - 0.4), ylabel="F1 (%)", title=f"per-class F1, {base} view")
    ax.grid(axis="y", alpha=0.3, zorder=0)
    handles = [Patch(color=col[m]) for m in chosen]
    fig.legend(handles, labels, loc="outside lower center", ncol=min(k, 2), frameon=False)
    fit_tick_labels(ax)
    file = f"f1-{base}.png"
    _save(fig, out, file)
    spread = ("bar: the mean over seeds; dots: each seed" if any(len(m) > 1 for _, m, _ in chosen.values())
              else "bar: the one seed's value (n = 1 seed)")
    caption = (f"Per-class F1 in %, {base} view (a method with fine-tuning budgets: its last budget), test split, "
               "at each seed's final round: per seed, F1 = 2 TP / (true + predicted windows) of each class from "
               "that seed's confusion.csv counts pooled over all clients (not the mean of per-client F1, so it "
               f"differs from metrics.csv's macro_f1); {spread}; a class with no window, true or predicted, has "
               f"no bar. y axis fixed at 0-100 %. {_used(chosen, note)}")
    short = f"Per-class F1, {base} view, test split, from the confusion counts pooled over clients."
    return Plot(file, f"per-class F1: {base}", short, "classes", notes=caption)
