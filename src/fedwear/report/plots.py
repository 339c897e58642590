"""PNG figures of runs grouped by method, each with a caption saying exactly what it shows.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot, no global backend switch).
A single run is the group ``{method: [run]}``; in a comparison a method's value is the mean over
its seeds of each seed's value, and a band or whisker spans min..max over seeds.

Axes are honest: a metric in % is drawn on 0-100 % (bars) or on its values' range widened and
rounded out to tens, never narrower than :data:`MIN_SPAN` points (lines, boxes), so a small
difference does not fill the axis; errors (MSE, MAE, MAPE) start at 0. A line at an axis limit
(a flat 0, a flat 100 %) stays visible above or below it. Round axes have integer ticks; a curve
with one evaluated round is a point. Views that are the same model (identical values in every
round and client, FedAvg's personalized and global) are drawn once and labelled so.

The figures: :func:`curve_plot` (one panel per metric, views overlaid), :func:`distribution_plots`
(per-client boxes per method), :func:`cost_plot` (the main metric against cumulative MB and wall
time), :func:`bytes_plot`, :func:`loss_plot`, :func:`timing_plot`; the headline figure is in
:mod:`fedwear.report.headline`, the per-class figures in :mod:`fedwear.report.classes`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from fedwear.config import KIND_METRICS
from fedwear.errors import FedwearError
from fedwear.evaluation.metrics import LOWER_IS_BETTER
from fedwear.evaluation.naive import NAIVE
from fedwear.report.rundir import Run
from fedwear.report.style import fit_tick_labels, paper_size, paper_style
from fedwear.report.tables import ordered_views, over_clients
from fedwear.report.units import NAMES, axis_label, scale, unit

Groups = dict[str, list[Run]]
DPI = 300  # print resolution: a paper's figures come from the same files
#: The narrowest y range (in percentage points) a metric in % is drawn on.
MIN_SPAN = 20.0
#: Line styles of the views in a figure's view order (colour is the method's).
VIEW_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)), (0, (3, 1, 1, 1)))
NAIVE_COLOR = "#777777"


def flat(groups: Groups) -> list[Run]:
    """Every run of ``groups``, in group order."""
    return [run for runs in groups.values() for run in runs]


def weighted(runs: Iterable[Run]) -> str:
    """How the runs' weighted means were taken over clients (``evaluation.client_weights``)."""
    how = {run.client_weights for run in runs}
    if len(how) == 1:
        return over_clients(how.pop())
    return "weighted mean over clients (weights: each run's evaluation.client_weights)"


#: The longest caption, in characters: two lines of a paper's double column at 9 pt (about 100
#: characters a line). What a reader needs beyond it goes to the figure's ``notes``.
MAX_CAPTION = 200


@dataclass
class Plot:
    """One PNG written to the report folder and the text that goes with it: ``caption`` says
    what it shows in at most :data:`MAX_CAPTION` characters, ``notes`` how to read it exactly
    (statistics, axes, which runs), for the page's one "How to read" block."""

    file: str
    title: str
    caption: str
    section: str
    row: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        if len(self.caption) > MAX_CAPTION:
            raise ValueError(f"{self.file}: a caption of {len(self.caption)} characters (at most {MAX_CAPTION}): "
                             f"{self.caption!r}")

    @property
    def text(self) -> str:
        """Caption and notes together."""
        return f"{self.caption} {self.notes}".strip()


def _palette(n: int) -> list:
    """Up to 10 methods: Tableau's colour-blind-safe 10 colours (matplotlib's style
    ``tableau-colorblind10``); more: tab20's, so that no two methods share a colour (each method
    also has its own marker)."""
    from matplotlib import colormaps, style

    if n <= 10:
        return list(style.library["tableau-colorblind10"]["axes.prop_cycle"].by_key()["color"])
    return [colormaps["tab20"](i) for i in range(20)]


def colors(groups: Groups) -> dict[str, str]:
    """A fixed colour per method (:func:`_palette`, in group order)."""
    return {m: style["color"] for m, style in styles(groups).items()}


def styles(groups: Groups) -> dict[str, dict]:
    """Colour and marker per method; earlier methods get larger markers, so the points of
    lines that coincide still show each method."""
    marks, n = "osD^vP<>Xp", len(groups)
    palette = _palette(n)
    return {m: {"color": palette[i % len(palette)], "marker": marks[i % 10],
                "size": 3 + min(1.5 * (n - 1 - i), 3)} for i, m in enumerate(groups)}


def views_of(groups: Groups) -> list[str]:
    """Views present on the test split of any run, in fedwear's order (the naive forecasts of a
    regression run after the evaluation views), then any others."""
    seen = {str(v) for runs in groups.values() for r in runs
            for v in r.metrics.loc[r.metrics["split"] == "test", "view"].unique()}
    return ordered_views(seen)


def metrics_of(groups: Groups) -> list[str]:
    """Metric columns of any run, first-seen order."""
    return list(dict.fromkeys(m for r in flat(groups) for m in r.metric_names))


def seeds_text(groups: Groups) -> str:
    """``fedavg: seeds 0, 1; local: seeds 0, 1`` (or ``seed 0`` for one run)."""
    return "; ".join(f"{method}: seed{'s' if len(runs) > 1 else ''} "
                     f"{', '.join(str(r.seed) for r in runs)}" for method, runs in groups.items())


def n_seeds(k: int) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{k} seed{'' if k == 1 else 's'}"


def seeds_n(groups: Groups) -> str:
    """How many seeds each method's numbers average: ``n = 3 seeds per method``, ``n = 1 seed``,
    or ``n = 3 seeds (fedavg), 1 seed (local)`` when they differ."""
    counts = {m: len(rs) for m, rs in groups.items()}
    if len(set(counts.values())) == 1:
        return f"n = {n_seeds(next(iter(counts.values())))}" + (" per method" if len(counts) > 1 else "")
    return "n = " + ", ".join(f"{n_seeds(k)} ({m})" for m, k in counts.items())


def multi_seed(groups: Groups) -> bool:
    return any(len(runs) > 1 for runs in groups.values())


def main_metric(groups: Groups) -> tuple[str, str]:
    """The (view, metric) a report leads with: ``evaluation.best_metric`` of the first run (e.g.
    ``personalized.accuracy``) when its runs record it, else the task's first metric (accuracy,
    MSE) on the personalized view (or the first view present)."""
    runs = flat(groups)
    metrics, views = metrics_of(groups), views_of(groups)
    rule = str(((runs[0].config.get("evaluation") or {}).get("best_metric") or "") if runs else "")
    view, _, metric = rule.partition(".")
    if metric not in metrics:
        kind = "regression" if "mse" in metrics else "classification"
        metric = next((m for m in KIND_METRICS[kind] if m in metrics), metrics[0] if metrics else "accuracy")
    if view not in views:
        view = "personalized" if "personalized" in views else (views[0] if views else "personalized")
    return view, metric


def _new_figure(width: float, height: float) -> Figure:
    """A figure for content laid out at ``width`` x ``height`` inches, drawn at a paper's column
    width (:func:`fedwear.report.style.paper_size`)."""
    fig = Figure(figsize=paper_size(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


#: ``fedwear report --format``: each figure as PNG (the page shows those) and, for ``pdf`` or
#: ``svg``, also as that vector file beside it, for a paper.
FORMATS = ("png", "pdf", "svg")
_EXTRA_FORMAT: ContextVar[str | None] = ContextVar("report_format", default=None)


@contextmanager
def figure_format(fmt: str) -> Iterator[None]:
    """Figures drawn inside in the report's style (:func:`fedwear.report.style.paper_style`) and
    saved also as ``fmt`` (one of :data:`FORMATS`; ``png``: PNG only)."""
    if fmt not in FORMATS:
        raise FedwearError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    token = _EXTRA_FORMAT.set(None if fmt == "png" else fmt)
    try:
        with paper_style():
            yield
    finally:
        _EXTRA_FORMAT.reset(token)


def _save(fig: Figure, out: Path, file: str) -> None:
    """``file`` (a PNG at :data:`DPI`), and the same figure as a vector file when asked
    (:func:`figure_format`); no creation date in either, so a report's bytes follow its runs."""
    fig.savefig(out / file, dpi=DPI, metadata={"Software": None})
    if (fmt := _EXTRA_FORMAT.get()) is not None:
        metadata = {"Creator": None, "Producer": None, "CreationDate": None} if fmt == "pdf" else {"Date": None}
        fig.savefig((out / file).with_suffix(f".{fmt}"), metadata=metadata)


# ---- axes ---------------------------------------------------------------------------------------
def axis_range(metric: str, values: Iterable[float], bars: bool = False) -> tuple[float, float, str]:
    """The y range (in display units) of ``values`` (metrics.csv units) and how it was chosen.

    A metric in %: bars on 0-100 %; other marks on the values' range widened by 5 points on each
    side, rounded out to tens, at least :data:`MIN_SPAN` points wide, within 0-100. Any other
    metric from 0 (or its lowest value, when negative) to its highest value plus 10 %."""
    factor = scale(metric)
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], float) * factor
    u = unit(metric) or ""
    if factor == 100.0:
        if bars or not len(v):
            return 0.0, 100.0, "0-100 % (the whole range)"
        lo = max(0.0, 10 * math.floor((v.min() - 5) / 10))
        hi = min(100.0, 10 * math.ceil((v.max() + 5) / 10))
        while hi - lo < MIN_SPAN:
            if hi < 100:
                hi = min(100.0, hi + 10)
            else:
                lo = max(0.0, lo - 10)
        return lo, hi, (f"{lo:g}-{hi:g} % (the values' range ±5 points, rounded out to tens, at least "
                        f"{MIN_SPAN:g} points wide, within 0-100 %)")
    top = float(v.max()) if len(v) else 1.0
    bottom = min(0.0, float(v.min())) if len(v) else 0.0
    hi = top * 1.1 if top > 0 else 1.0
    return bottom, hi, f"{bottom:.4g}-{hi:.4g}{' ' + u if u else ''} (from {'0' if bottom == 0 else 'the lowest value'} to the highest value + 10 %)"


def set_range(ax, lo: float, hi: float) -> None:
    """``ax``'s y limits: ``lo..hi`` padded by 2 % so a line at either limit stays visible."""
    pad = 0.02 * (hi - lo or 1.0)
    ax.set_ylim(lo - pad, hi + pad)


#: At most this many round ticks on an axis.
MAX_ROUND_TICKS = 8


def round_ticks(rounds: list[int]) -> list[int]:
    """Ticks where the points are (a locator's own fell between them: 6, 9, 12 for points at 5,
    10, 15): every drawn round when there are at most :data:`MAX_ROUND_TICKS`, else those that
    are multiples of a round number of the points' step (every 50th round of 300), else every
    k-th point."""
    if len(rounds) <= MAX_ROUND_TICKS:
        return rounds
    steps = np.diff(rounds)
    step = int(np.bincount(steps).argmax()) or 1  # the usual distance between evaluated rounds
    for m in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000):
        ticks = [r for r in rounds if r % (step * m) == 0]
        if 2 <= len(ticks) <= MAX_ROUND_TICKS:
            return ticks
    return rounds[:: math.ceil(len(rounds) / MAX_ROUND_TICKS)]


def round_axis(ax, rounds: Iterable[float]) -> None:
    """Round ticks where the points are (:func:`round_ticks`); a single round sits in the middle
    of ``round - 1 .. round + 1``."""
    rs = sorted({int(r) for r in rounds})
    if rs:
        pad = 0.04 * (rs[-1] - rs[0]) or 1.0  # 4 % of the span on each side, 1 round around one
        ax.set_xlim(rs[0] - pad, rs[-1] + pad)
        ax.set_xticks(round_ticks(rs))


def show_zero(ax) -> None:
    """Lower the y axis a little below 0 when it starts at 0, so a flat 0 line (Local's bytes)
    is not hidden under the axis."""
    lo, hi = ax.get_ylim()
    if lo >= 0:
        ax.set_ylim(-0.03 * (hi - lo or 1.0), hi)


def _seed_band(series: list[pd.Series]) -> pd.DataFrame:
    """Per round (index) with a value: mean, min and max over the seeds' values (NaN ignored)."""
    table = pd.concat(series, axis=1)
    return pd.DataFrame({"mean": table.mean(axis=1), "lo": table.min(axis=1),
                         "hi": table.max(axis=1)}).dropna(subset=["mean"])


def _draw_band(ax, stats: pd.DataFrame, style: dict, label: str, factor: float = 1.0,
               ls: str | tuple = "-", alpha: float = 0.12) -> None:
    """The mean line (a marker on each point; see :func:`_thin_markers`) and, when seeds differ,
    the min..max band; x: the column ``x`` of ``stats``, else its index (the round)."""
    x = stats.get("x", stats.index).to_numpy(float)
    color = style["color"]
    ax.plot(x, factor * stats["mean"], color=color, marker=style["marker"], markersize=style["size"],
            lw=1.6, ls=ls, label=label)
    if (stats["hi"] > stats["lo"]).any():
        ax.fill_between(x, factor * stats["lo"], factor * stats["hi"], color=color, alpha=alpha, lw=0)


def _thin_markers(ax, every: int = 15) -> None:
    """On lines of more than 40 points, keep a marker every 1/``every`` of the x range, staggered
    between lines, so a line hidden under another (FedHome under FedAvg until its
    personalization rounds) still shows without markers covering the curves."""
    lines = ax.get_lines()
    lo, hi = ax.get_xlim()
    step = (hi - lo) / every
    for i, line in enumerate(lines):
        x = np.asarray(line.get_xdata(), float)
        if len(x) > 40:
            targets = np.arange(lo + step * (0.5 + i / len(lines)), x.max(), step)
            line.set_markevery(sorted(set(np.searchsorted(x, targets).clip(0, len(x) - 1).tolist())))


def _legend(fig: Figure, ax, groups: Groups, always: bool = False) -> None:
    """The lines' labels below the axes, when there is more than one method (or ``always``)."""
    handles, labels = ax.get_legend_handles_labels()
    if labels and (len(groups) > 1 or always):
        ncol = min(len(labels), 4 if max(map(len, labels)) <= 12 else 2)
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False)


def _weighted_series(run: Run, view: str, metric: str) -> pd.Series:
    agg = run.aggregated
    sel = agg[(agg["view"] == view) & (agg["split"] == "test") & (agg["metric"] == metric)]
    return sel.set_index("round")["weighted"].astype(float).rename(str(run.seed))


# ---- views that are the same model ------------------------------------------------------------
def _view_rows(run: Run, view: str) -> pd.DataFrame:
    m = run.metrics
    cols = ["round", "client", "n", *run.metric_names]
    sel = m[(m["view"] == view) & (m["split"] == "test")][cols].astype({"client": str})
    return sel.sort_values(["round", "client"], kind="stable").reset_index(drop=True)


def same_model_views(runs: list[Run]) -> dict[str, str]:
    """``{view: earlier view}`` for the views whose test rows equal an earlier view's (fedwear's
    view order) in every run: the same rounds, clients and window counts and identical values of
    every metric (NaN where the other is NaN), i.e. the same model scored twice (FedAvg's
    personalized and global views)."""
    if not runs:
        return {}
    common = [v for v in ordered_views({str(v) for v in runs[0].metrics["view"].unique()})
              if all((r.metrics["view"] == v).any() for r in runs) and v not in NAIVE]
    rows = {(i, v): _view_rows(r, v) for i, r in enumerate(runs) for v in common}
    out: dict[str, str] = {}
    for k, a in enumerate(common):
        if a in out:
            continue
        for b in common[k + 1:]:
            if b not in out and all(len(rows[(i, a)]) and rows[(i, a)].equals(rows[(i, b)])
                                    for i in range(len(runs))):
                out[b] = a
    return out


def also_text(view: str, same: dict[str, dict[str, str]]) -> str:
    """`` (= global for fedavg)`` after ``view`` for the views drawn as ``view`` ('' when none)."""
    also: dict[str, list[str]] = {}
    for method, pairs in same.items():
        for b, a in pairs.items():
            if a == view:
                also.setdefault(b, []).append(method)
    return "".join(f" (= {b} for {', '.join(ms)})" for b, ms in also.items())


def same_text(same: dict[str, dict[str, str]]) -> str:
    """``fedavg, fedprox: personalized = global`` for the views drawn once ('' when none)."""
    pairs: dict[str, list[str]] = {}
    for method, views in same.items():
        for b, a in views.items():
            pairs.setdefault(f"{a} = {b}", []).append(method)
    return "; ".join(f"{', '.join(ms)}: {pair}" for pair, ms in pairs.items())


# ---- curves -------------------------------------------------------------------------------------
def curve_plot(groups: Groups, out: Path) -> Plot | None:
    """``curves.png``: one panel per metric, the test-split value at each evaluated round; one
    line per method (colour) and view (line style), the mean over seeds with a min..max band.
    A view identical to an earlier one for a method (the same model) is drawn once, its legend
    entry saying ``personalized = global``; the naive forecasts of a regression run (the same for
    every method) once, in grey. None when no run evaluated a round."""
    metrics, views = metrics_of(groups), views_of(groups)
    if not views or not metrics:
        return None
    sty = styles(groups)
    same = {m: same_model_views(rs) for m, rs in groups.items()}
    line = {v: VIEW_STYLES[i % len(VIEW_STYLES)] for i, v in enumerate(views)}
    fig = _new_figure(0.6 + 4.3 * len(metrics), 4.2 if len(groups) * len(views) <= 8 else 4.8)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    ranges, drawn_views, naive_from = [], [], None
    for ax, metric in zip(axes, metrics, strict=True):
        values, rounds = [], set()
        for method, runs in groups.items():
            for view in views:
                if view in same[method]:
                    continue
                naive = view in NAIVE
                if naive and naive_from not in (None, method):
                    continue
                series = [s for s in (_weighted_series(r, view, metric) for r in runs) if s.notna().any()]
                if not series:
                    continue
                if naive:
                    naive_from = method
                stats = _seed_band(series)
                style = {**sty[method], "color": NAIVE_COLOR} if naive else sty[method]
                _draw_band(ax, stats, style, f"{method} {view}", scale(metric), line[view])
                values += [*stats["lo"], *stats["hi"]]
                rounds |= set(stats.index)
                drawn_views.append(view)
        lo, hi, how = axis_range(metric, values)
        set_range(ax, lo, hi)
        round_axis(ax, rounds)
        ranges.append(f"{NAMES.get(metric, metric)} {how}")
        ax.set(xlabel="round", ylabel=axis_label(metric), title=NAMES.get(metric, metric))
        ax.grid(alpha=0.3)
        _thin_markers(ax)
    shown = [v for v in views if v in drawn_views]
    if not shown:  # every value NaN (a run that reported no number): no curve to draw
        return None
    labels = list(groups) if any(v not in NAIVE for v in shown) else []
    handles = [Line2D([], [], color=sty[m]["color"], marker=sty[m]["marker"], lw=1.6) for m in labels]
    for view in shown:
        naive = view in NAIVE
        handles.append(Line2D([], [], color=NAIVE_COLOR if naive else "#333333", ls=line[view], lw=1.6))
        labels.append(f"{view}" + (" (naive forecast)" if naive else "") + also_text(view, same))
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4), frameon=False)
    _save(fig, out, "curves.png")
    every = weighted(flat(groups))
    spread = (f"line: mean over seeds of each seed's {every}; shaded band: min..max over seeds"
              if multi_seed(groups) else f"one seed: {every}")
    merged = same_text(same)
    notes = (f"Test split, at each evaluated round, one panel per metric; colour: method, line style: "
               f"view; {spread} ({seeds_text(groups)}; {seeds_n(groups)}). "
               + (f"Drawn once where two views are the same model (identical values in every round "
                  f"and client): {merged}. " if merged else "")
               + (f"Naive forecasts (grey) from {naive_from}'s runs: they depend on the data only. "
                  if naive_from else "")
               + f"y axes: {'; '.join(ranges)}.")
    short = (f"{', '.join(NAMES.get(m, m) for m in metrics)} at each evaluated round, test split; colour: method, "
             f"line style: view" + ("; band: min..max over seeds." if multi_seed(groups) else "."))
    return Plot("curves.png", "metrics per round", short, "curves", notes=notes)


# ---- per-client distributions -------------------------------------------------------------------
def final_rows(run: Run, view: str) -> pd.DataFrame:
    """The test-split rows of ``view`` at the run's final round (its last evaluated round)."""
    m = run.metrics
    return m[(m["round"] == run.summary.get("final_round")) & (m["view"] == view) & (m["split"] == "test")]


def worst_decile(values: np.ndarray, metric: str) -> float:
    """Mean of the worst 10 % of clients (at least one): the lowest values, the highest for an
    error (as ``summary.json``'s ``worst10``)."""
    v = np.sort(values[~np.isnan(values)])
    if not len(v):
        return float("nan")
    k = max(1, math.ceil(0.1 * len(v)))
    return float((v[::-1] if metric in LOWER_IS_BETTER else v)[:k].mean())


def distribution_plots(groups: Groups, out: Path) -> list[Plot]:
    """``distribution-<metric>.png``: one panel per view, one box per method over the clients of
    every seed at each seed's final round (each point one client of one seed), the worst decile
    (mean of the worst 10 % of clients, averaged over seeds) marked in red. The naive forecasts
    of a regression run get one box (the same for every method)."""
    plots, col = [], colors(groups)
    views = views_of(groups)
    same = {m: same_model_views(rs) for m, rs in groups.items()}
    for metric in metrics_of(groups):
        panels: dict[str, dict[str, tuple[np.ndarray, float]]] = {}
        for view in views:
            per_method = {}
            for method, runs in groups.items():
                if view in same[method]:  # the same model as an earlier view: drawn there once
                    continue
                seeds = [final_rows(r, view)[metric].dropna().to_numpy(float)
                         for r in runs if metric in r.metrics]
                seeds = [s for s in seeds if len(s)]
                if seeds:
                    per_method[method] = (np.concatenate(seeds),
                                          float(np.mean([worst_decile(s, metric) for s in seeds])))
                    if view in NAIVE:
                        break
            if per_method:
                panels[view] = per_method
        if not panels:
            continue
        factor = scale(metric)
        k = max(len(p) for p in panels.values())
        fig = _new_figure(min(18.0, 0.8 + len(panels) * (0.9 + 0.55 * k)), 4.0)
        axes = fig.subplots(1, len(panels), squeeze=False, sharey=factor == 100.0)[0]
        everything = [v for p in panels.values() for vals, w in p.values() for v in (*vals, w)]
        lo, hi, how = axis_range(metric, everything)
        rng = np.random.default_rng(0)  # the jitter of the points: the same every time
        for ax, (view, per_method) in zip(axes, panels.items(), strict=True):
            names = list(per_method)
            for i, method in enumerate(names):
                vals, worst = per_method[method]
                color = NAIVE_COLOR if view in NAIVE else col[method]
                box = ax.boxplot([factor * vals], positions=[i], widths=0.55, patch_artist=True,
                                 showfliers=False, medianprops={"color": "black", "lw": 1.2})
                for patch in box["boxes"]:
                    patch.set(facecolor=color, alpha=0.28, edgecolor=color)
                ax.scatter(i + rng.uniform(-0.18, 0.18, len(vals)), factor * vals, s=9, color=color,
                           alpha=0.8, lw=0, zorder=3)
                ax.plot([i - 0.32, i + 0.32], [factor * worst] * 2, color="#d62728", lw=2.2, zorder=4)
            labels = ([f"naive\nn = {len(per_method[names[0]][0])}"] if view in NAIVE else
                      [f"{m}\nn = {len(per_method[m][0])}" for m in names])
            ax.set_xticks(range(len(names)), labels)
            ax.set(xlim=(-0.6, len(names) - 0.4), title=view + also_text(view, same))
            ax.grid(axis="y", alpha=0.3)
            if factor == 100.0:
                set_range(ax, lo, hi)
            else:  # errors: each view on its own scale from 0 (the naive forecasts' are larger)
                vlo, vhi, _ = axis_range(metric, [v for vals, w in per_method.values() for v in (*vals, w)])
                set_range(ax, vlo, vhi)
        axes[0].set_ylabel(axis_label(metric))
        fig.legend([Line2D([], [], color="#d62728", lw=2.2), Line2D([], [], color="black", lw=1.2)],
                   ["worst decile: mean of the worst 10 % of clients (mean over seeds)", "median"],
                   loc="outside lower center", ncol=2, frameon=False)
        fit_tick_labels(*axes)
        file = f"distribution-{metric}.png"
        _save(fig, out, file)
        rounds = sorted({str(r.summary.get("final_round")) for r in flat(groups)})
        scale_text = (f"y axis {how}" if factor == 100.0 else
                      "each view on its own y axis, from 0 to its highest value + 10 %")
        caption = (f"{NAMES.get(metric, metric)} of each client on the test split at each seed's final round "
                   f"(round {', '.join(rounds)}), one panel per view: per method a box (quartiles, median; "
                   f"whiskers 1.5 IQR) over the points, each point one client of one seed (n = clients x seeds "
                   f"under each box); red: the worst decile, the mean of the worst 10 % of clients "
                   f"({'highest' if metric in LOWER_IS_BETTER else 'lowest'} values) per seed, averaged over "
                   f"seeds. Runs: {seeds_text(groups)}. {scale_text}.")
        short = (f"{NAMES.get(metric, metric)} of each client at the final round, test split: a box per method "
                 "and view, a point per client and seed; red: the worst decile.")
        plots.append(Plot(file, f"per client: {NAMES.get(metric, metric)}", short, "clients", notes=caption))
    return plots


# ---- federated cost -----------------------------------------------------------------------------
def _cumulative(frame: pd.DataFrame, columns: list[str]) -> pd.Series:
    """The cumulative sum over rounds of ``columns`` of ``frame`` (rounds.csv or timing.csv)."""
    if not len(frame) or any(c not in frame for c in columns):
        return pd.Series(dtype=float)
    s = frame.set_index("round")[columns].astype(float).fillna(0.0).sum(axis=1)
    return s.groupby(level=0).sum().sort_index().cumsum()


def cost_plot(groups: Groups, out: Path) -> Plot | None:
    """``cost.png``: the main metric (:func:`main_metric`) at each evaluated round against the
    training bytes communicated so far (down + up, MB) and against the wall-clock seconds so far;
    one line per method, both coordinates the mean over seeds. None when no run evaluated a
    round."""
    view, metric = main_metric(groups)
    sty = styles(groups)
    lines: dict[str, dict[str, pd.DataFrame]] = {"mb": {}, "s": {}}
    used: dict[str, str] = {}
    for method, runs in groups.items():
        v = view if any((r.metrics["view"] == view).any() for r in runs) else next(
            (x for x in views_of({method: runs}) if x not in NAIVE), None)
        if v is None:
            continue
        for key, of in (("mb", lambda r: _cumulative(r.rounds, ["bytes_down", "bytes_up"]) / 1e6),
                        ("s", lambda r: _cumulative(r.timing, ["wall_s"]))):
            per_seed = []
            for r in runs:
                y = _weighted_series(r, v, metric).dropna()
                x = of(r).reindex(y.index)
                if 0 in y.index and pd.isna(x.get(0)):  # evaluated before any training round
                    x.loc[0] = 0.0
                if len(both := pd.DataFrame({"x": x, "y": y}).dropna()):
                    per_seed.append(both)
            if per_seed:
                lines[key][method] = pd.concat(per_seed).groupby(level="round").agg(
                    x=("x", "mean"), mean=("y", "mean"), lo=("y", "min"), hi=("y", "max"))
                used[method] = v
    if not lines["mb"] and not lines["s"]:
        return None
    fig = _new_figure(9.6, 4.0)
    axes = fig.subplots(1, 2, squeeze=False)[0]
    factor = scale(metric)
    values = [v for d in lines.values() for t in d.values() for v in (*t["lo"], *t["hi"])]
    lo, hi, how = axis_range(metric, values)
    several_views = len(set(used.values())) > 1
    name = NAMES.get(metric, metric)
    panels = (("mb", "training MB communicated so far (down + up)", "communication"),
              ("s", "wall-clock seconds so far", "time"))
    for ax, (key, xlabel, title) in zip(axes, panels, strict=True):
        for method, t in lines[key].items():
            label = f"{method} ({used[method]})" if several_views else method
            _draw_band(ax, t, sty[method], label, factor, alpha=0.15)
        set_range(ax, lo, hi)
        right = max([float(t["x"].max()) for t in lines[key].values()] or [1.0]) or 1.0
        ax.set(xlim=(-0.03 * right, 1.05 * right), xlabel=xlabel, ylabel=axis_label(metric),
               title=f"{name} vs {title}")
        ax.grid(alpha=0.3)
        _thin_markers(ax)
    _legend(fig, axes[0], groups)
    _save(fig, out, "cost.png")
    views_text = (", ".join(f"{m}: {v}" for m, v in used.items()) if several_views else f"{view} view")
    spread = ("mean over seeds of both coordinates, band: min..max over seeds of the metric"
              if multi_seed(groups) else "one seed per method")
    zero = [m for m, t in lines["mb"].items() if float(t["x"].max()) == 0.0]
    caption = (f"{name} ({views_text}, test split, {weighted(flat(groups))}) at each "
               "evaluated round against the cumulative training traffic of rounds.csv (bytes_down + bytes_up, "
               "in MB = 10^6 bytes; evaluation traffic left out) and against the cumulative wall-clock seconds of "
               f"timing.csv (training and evaluation); {spread} ({seeds_text(groups)}). "
               + (f"{', '.join(zero)} sent no training bytes: at 0 MB. " if zero else "")
               + f"y axis {how}.")
    short = f"{name} against the training traffic and the wall-clock time so far, test split ({views_text})."
    if len(short) > MAX_CAPTION:  # many methods, each on its own view: the notes list them
        short = f"{name} against the training traffic and the wall-clock time so far, test split (views: how to read)."
    return Plot("cost.png", "federated cost", short, "cost", notes=caption)


# ---- training -----------------------------------------------------------------------------------
def _round_series(frame: pd.DataFrame, column: str, seed, cumulative: bool = False) -> pd.Series:
    """``column`` of ``frame`` (rounds.csv or timing.csv) per round, named after the seed."""
    if column not in frame:
        return pd.Series(dtype=float, name=str(seed))
    s = frame.set_index("round")[column].astype(float)
    return (s.cumsum() if cumulative else s).rename(str(seed))


def _across_seeds(groups: Groups) -> str:
    return ("Line: mean over seeds; shaded band: min..max over seeds "
            f"({seeds_text(groups)})" if multi_seed(groups) else f"Runs: {seeds_text(groups)}")


def _line_plot(groups: Groups, out: Path, file: str, lines: list, ylabel: str, title: str,
               factor: float = 1.0, legend: bool = False) -> None:
    """``file``: per (method, label, line style, each seed's series) of ``lines``, the mean over
    seeds and its band against the round; ``legend``: a legend also for a single method."""
    fig = _new_figure(4.8, 3.5 if len(groups) > 1 or legend else 3.2)
    ax = fig.add_subplot()
    sty = styles(groups)
    drawn = False
    for method, label, ls, per_seed in lines:
        per_seed = [s for s in per_seed if s.notna().any()]
        if per_seed:
            _draw_band(ax, _seed_band(per_seed), sty[method], label, factor, ls)
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no values recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set(xlabel="round", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    round_axis(ax, [float(x) for line in ax.get_lines() for x in line.get_xdata()])
    if drawn:
        show_zero(ax)
    _thin_markers(ax)
    _legend(fig, ax, groups, always=legend)
    _save(fig, out, file)


def bytes_plot(groups: Groups, out: Path, way: str) -> Plot:
    """Cumulative bytes ``way`` ("up" or "down") in MB; evaluation traffic dashed when
    rounds.csv records it."""
    has_eval = any(f"eval_bytes_{way}" in r.rounds for r in flat(groups))
    kinds = [("", "-", "training")] + ([("eval_", "--", "evaluation")] if has_eval else [])
    lines = [(method, f"{method}, {kind}" if has_eval else method, ls,
              [_round_series(r.rounds, f"{prefix}bytes_{way}", r.seed, True) for r in rs])
             for method, rs in groups.items() for prefix, ls, kind in kinds]
    direction = "clients to server" if way == "up" else "server to clients"
    file = f"bytes_{way}.png"
    _line_plot(groups, out, file, lines, "cumulative MB", f"bytes {way}: {direction}", 1e-6, has_eval)
    what = ("training replies accepted into aggregation" if way == "up"
            else "training payloads sent to the selected clients")
    caption = (f"Cumulative bytes_{way} per round from rounds.csv ({what}), summed over clients, "
               "in MB (10^6 bytes)")
    if has_eval:
        caption += (f"; dashed: eval_bytes_{way}, the evaluation traffic of evaluated rounds "
                    "(see bytes_notes in summary.json)")
    return Plot(file, f"bytes {way}", f"Cumulative MB sent {direction} in training, per round.", "training",
                "communication", notes=f"{caption}; y axis from just below 0. {_across_seeds(groups)}.")


def loss_plot(groups: Groups, out: Path) -> Plot:
    """Training loss per round (rounds.csv ``train_loss``)."""
    lines = [(m, m, "-", [_round_series(r.rounds, "train_loss", r.seed) for r in runs])
             for m, runs in groups.items()]
    _line_plot(groups, out, "train_loss.png", lines, "train loss", "training loss")
    caption = ("train_loss from rounds.csv: per round, the unweighted mean over the clients whose "
               "reply was accepted of the training loss each reported (rounds without a reported "
               f"loss are left out). {_across_seeds(groups)}.")
    return Plot("train_loss.png", "training loss", "Training loss per round: the mean over the clients that replied.",
                "training", "training", notes=caption)


def timing_plot(groups: Groups, out: Path) -> Plot:
    """Wall-clock seconds per round (timing.csv)."""
    lines = [(m, m, "-", [_round_series(r.timing, "wall_s", r.seed) for r in runs])
             for m, runs in groups.items()]
    _line_plot(groups, out, "wall_time.png", lines, "seconds", "wall-clock time per round")
    caption = ("wall_s from timing.csv: seconds per round, training plus evaluation when the round "
               f"was evaluated. {_across_seeds(groups)}.")
    return Plot("wall_time.png", "wall-clock time", "Wall-clock seconds per round: training, and evaluation in "
                "evaluated rounds.", "training", "training", notes=caption)


def _budget(run: Run) -> float:
    """The epsilon a run spent (inf: no DP)."""
    p = run.summary.get("privacy") or {}
    return float(p["epsilon"]) if p.get("dp") == "central" and p.get("epsilon") is not None else math.inf


def privacy_plot(groups: Groups, out: Path) -> Plot | None:
    """Utility against privacy: each method's best-round score at each epsilon its runs spent, no
    DP at the right (None when no run used DP). Methods are the runs' own ``method``, so the rows
    of one method at several budgets make one line; a method with no DP run is left out."""
    runs = [r for r in flat(groups) if r.evaluated and not r.unfinished]
    if not any(math.isfinite(_budget(r)) for r in runs):
        return None
    view, metric = main_metric(groups)
    points: dict[str, dict[float, list[float]]] = {}
    for r in runs:
        value = ((r.summary.get("best") or {}).get(view) or {}).get(metric)
        if value is not None:
            eps = round(_budget(r), 2)
            points.setdefault(str(r.config.get("method", r.method)), {}).setdefault(eps, []).append(float(value))
    points = {m: by for m, by in points.items() if any(math.isfinite(e) for e in by)}  # only methods run with DP
    budgets = sorted({e for by in points.values() for e in by})
    x_of = {e: i for i, e in enumerate(budgets)}
    fig = _new_figure(3.4, 2.6)
    ax = fig.add_subplot()
    factor = scale(metric)
    palette = styles({m: [] for m in points})
    for method, by in points.items():
        xs = [x_of[e] for e in sorted(by)]
        values = [np.asarray(by[e]) * factor for e in sorted(by)]
        means = [v.mean() for v in values]
        ax.plot(xs, means, color=palette[method]["color"], marker=palette[method]["marker"], label=method)
        for x, v in zip(xs, values, strict=True):
            if len(v) > 1:
                ax.vlines(x, v.min(), v.max(), color=palette[method]["color"], alpha=0.5)
    lo, hi, how = axis_range(metric, [v for by in points.values() for vs in by.values() for v in vs])
    set_range(ax, lo, hi)
    ax.set(xticks=range(len(budgets)), xticklabels=[f"{e:g}" if math.isfinite(e) else "no DP" for e in budgets],
           xlabel="epsilon per client (delta as summary.json records)", ylabel=axis_label(metric),
           title=f"{view} {NAMES.get(metric, metric)} against privacy")
    ax.grid(alpha=0.3)
    _legend(fig, ax, points, always=True)
    _save(fig, out, "privacy.png")
    caption = f"{view} {NAMES.get(metric, metric)} at each run's best round against the epsilon it spent."
    notes = (f"Methods with a DP run: {', '.join(points)}. "
             f"Each point: the mean over the seeds of one method at one budget (line: min..max over seeds "
             f"when several); epsilon from each run's summary.json (dp-accounting's RDP accountant over the "
             f"rounds run, docs/privacy.md); the best round is chosen as the run's best_rule chose it, which "
             f"is not itself private. y axis {how}.")
    return Plot("privacy.png", "utility against privacy", caption, "cost", notes=notes)
