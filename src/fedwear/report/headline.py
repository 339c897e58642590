"""The headline figure of a report: every method on every view in the main metric, the mean over
seeds with each seed shown, the reference method marked, and the paper's number beside a method
where the comparison belongs to a registered paper table.

Which paper table a folder belongs to is decided above this layer (``fedwear report``'s command,
``fedwear.commands.paper_numbers``, which reads ``fedwear.reproduce``); it arrives here as
:class:`PaperNumbers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from fedwear.evaluation.naive import NAIVE
from fedwear.report.plots import (
    Groups,
    Plot,
    _new_figure,
    _save,
    also_text,
    axis_range,
    colors,
    final_rows,
    flat,
    main_metric,
    n_seeds,
    same_model_views,
    same_text,
    seeds_n,
    seeds_text,
    set_range,
    views_of,
    weighted,
)
from fedwear.report.rundir import unlike_seeds
from fedwear.report.style import fit_tick_labels
from fedwear.report.units import NAMES, axis_label, fmt, scale


@dataclass
class PaperNumbers:
    """Published numbers to draw beside ours.

    ``values[name][(view, metric)]`` is the paper's value for the method or variant ``name`` (a
    comparison's group, ``Run.name``), in metrics.csv's units (classification as a fraction,
    errors in bpm); ``sources[name]`` says where that name's numbers come from (paper, table,
    what the numbers are); ``source`` how the folder was matched to the table(s); ``none`` why
    there are none (then ``values`` is empty)."""

    values: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    source: str = ""
    none: str = ""
    sources: dict[str, str] = field(default_factory=dict)


NO_PAPER = PaperNumbers(none="no registered paper table is known for this folder")


def _dark(color) -> bool:
    """Whether white text reads on ``color`` (relative luminance below 0.5)."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5


def _values(runs: list, view: str, metric: str) -> np.ndarray:
    v = np.array([((r.summary.get("final") or {}).get(view) or {}).get(metric) for r in runs], float)
    return v[~np.isnan(v)]  # None: NaN


def headline_plot(groups: Groups, out: Path, reference: str | None = None,
                  paper: PaperNumbers | None = None) -> Plot | None:
    """``headline.png``: per view (x groups) one bar per method, the mean over seeds of each
    seed's final-round weighted mean over clients (test split) in the main metric
    (:func:`~fedwear.report.plots.main_metric`), each seed a dot, a min..max whisker; the
    reference method hatched, its value a dashed line across each view; the paper's number a
    black line across the method's bar with a star at its right end. y: 0-100 % for a metric in
    %, else from 0. None when no run evaluated a round."""
    paper = paper or NO_PAPER
    _, metric = main_metric(groups)
    # a view that is the same model as an earlier one (FedAvg's global and personalized) is drawn once
    same = {m: same_model_views(rs) for m, rs in groups.items()}
    views = [v for v in views_of(groups) if any(len(_values(rs, v, metric)) and v not in same[m]
                                                 for m, rs in groups.items())]
    if not views:
        return None
    if len(flat(groups)) == 1:
        return _run_headline(flat(groups)[0], out, metric, views, same, paper)
    ref = reference if reference is not None else next(iter(groups))  # default: the first method
    col = colors(groups)
    methods = list(groups)
    # per view, the methods with a value or a paper number there, centred in the view's slot
    present = {v: [m for m in methods if v not in same[m] and (len(_values(groups[m], v, metric))
                                                               or (v, metric) in paper.values.get(m, {}))]
               for v in views}
    k = max(len(p) for p in present.values())
    factor = scale(metric)
    width = 0.8 / k
    fig = _new_figure(min(18.0, max(5.5, 1.4 + len(views) * (0.5 + 0.42 * k))), 4.4)
    ax = fig.add_subplot()
    drawn_values, stars, bars = [], False, []  # bars: (x, method, each seed's value)
    for g, view in enumerate(views):
        here = present[view]
        for i, method in enumerate(here):
            vals = _values(groups[method], view, metric)
            x = g + (i - (len(here) - 1) / 2) * width
            want = paper.values.get(method, {}).get((view, metric))
            if want is not None:  # a line across the bar at the paper's value, a star at its right end
                half = width * 0.46
                ax.hlines(factor * want, x - half, x + half, colors="black", lw=1.6, zorder=5)
                ax.plot([x + half], [factor * want], marker="*", color="black", markersize=11, ls="none", zorder=5)
                drawn_values.append(want)
                stars = True
            if not len(vals):
                continue
            mean = float(vals.mean())
            is_ref = method == ref
            ax.bar(x, factor * mean, width=width * 0.92, color=col[method], alpha=0.85,
                   hatch="//" if is_ref else None, edgecolor="black" if is_ref else col[method],
                   lw=1.3 if is_ref else 0.5, zorder=2)
            bars.append((x, method, vals))
            if len(vals) > 1:
                ax.vlines(x, factor * vals.min(), factor * vals.max(), color="black", lw=1.1, zorder=3)
            ax.scatter(np.full(len(vals), x), factor * vals, s=12, color="white", edgecolor="black",
                       lw=0.7, zorder=4)
            drawn_values += list(vals)
            if is_ref:
                ax.hlines(factor * mean, g - 0.45, g + 0.45, colors="black", linestyles="--", lw=0.9, zorder=1)
        if g < len(views) - 1:
            ax.axvline(g + 0.5, color="#dddddd", lw=0.8, zorder=0)
    lo, hi, how = axis_range(metric, drawn_values, bars=True)
    if factor != 100.0:
        hi *= 1.12  # room for the value labels
    set_range(ax, lo, hi)
    # each bar's mean: inside at its foot, above a short bar; none over more than 32 bars
    for x, method, vals in bars if len(bars) <= 32 else []:
        mean = factor * float(vals.mean())
        tall = mean - lo >= 0.22 * (hi - lo)
        y = lo + 0.015 * (hi - lo) if tall else factor * float(vals.max()) + 0.01 * (hi - lo)
        ax.text(x, y, fmt(metric, float(vals.mean())), rotation=90, ha="center", va="bottom", fontsize=7,
                color="white" if tall and _dark(col[method]) else "black", fontweight="bold" if tall else "normal",
                zorder=6)
    ax.set_xticks(range(len(views)), [v + also_text(v, same).replace(" (", "\n(") for v in views])
    ax.set(xlim=(-0.5, len(views) - 0.5), ylabel=axis_label(metric))
    ax.grid(axis="y", alpha=0.3, zorder=0)
    counts = {m: len(rs) for m, rs in groups.items()}
    same_n = len(set(counts.values())) == 1
    # the seeds per method are in the legend when they differ: a title listing them all is cut off
    title = f"{NAMES.get(metric, metric)}, final round, test split"
    ax.set_title(f"{title}; {seeds_n(groups)}" if same_n else title)
    handles = [Patch(facecolor=col[m], edgecolor="black" if m == ref else col[m],
                     hatch="//" if m == ref else None) for m in methods]
    labels = [m + (" (reference)" if m == ref else "") + ("" if same_n else f", n = {n_seeds(counts[m])}")
              for m in methods]
    handles.append(Line2D([], [], marker="o", color="black", markerfacecolor="white", ls="none"))
    labels.append("one seed" if counts[ref] == 1 and same_n else "each seed")
    if stars:
        handles.append(Line2D([], [], marker="*", color="black", markersize=10, ls="none"))
        labels.append("paper's number")
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 5), frameon=False)
    fit_tick_labels(ax)
    _save(fig, out, "headline.png")
    same = same_text(same)
    naive = [v for v in views if v in NAIVE]
    spread = ("bar: the mean over seeds; dots: each seed; whisker: min..max over seeds"
              if any(n > 1 for n in counts.values()) else "bar: the one seed's value (no spread: n = 1 seed)")
    if paper.values:
        drawn = [m for m in methods if any((v, metric) in paper.values.get(m, {}) for v in views)]
        by_source: dict[str, list[str]] = {}
        for m in drawn:
            by_source.setdefault(paper.sources.get(m, "the paper"), []).append(m)
        paper_text = ("Black line with a star at its right end: the paper's number, "
                      + "; ".join(f"{', '.join(ms)}: {src}" for src, ms in by_source.items())
                      + f" ({paper.source})." if drawn else
                      f"No paper number in {NAMES.get(metric, metric)} for these methods and views ({paper.source}).")
    else:
        paper_text = f"No paper number: {paper.none}."
    notes = (f"{NAMES.get(metric, metric)} at each seed's final round (its last evaluated round), test split, "
               f"per seed the {weighted(flat(groups))}; {spread}; {seeds_n(groups)} ({seeds_text(groups)}). "
               f"Reference: {ref} (hatched; dashed line: its value across each view). "
               + (f"Views that are the same model (identical values in every round and client): {same}. "
                  if same else "")
               + (f"{', '.join(naive)}: the naive forecasts beside each method. " if naive else "")
               + f"{paper_text} y axis {how if factor == 100.0 else how + ', with room for the labels'}; "
               "the number on each bar is its mean.")
    if unfinished := [run.label for run in flat(groups) if run.unfinished]:
        notes += f" Read as far as they got (no summary.json yet): {'; '.join(unfinished)}."
    if unlike := unlike_seeds(groups):
        notes += f" Seeds not alike, so a bar's mean mixes them: {'; '.join(unlike)}."
    short = (f"{NAMES.get(metric, metric)} of each method in each view at the final round, test split; "
             + ("bar: mean over seeds, dots: seeds" if any(n > 1 for n in counts.values()) else "one seed each")
             + f"; reference {ref} hatched" + ("; star: the paper's number." if stars else "."))
    return Plot("headline.png", "headline", short, "headline", notes=notes)


def _run_headline(run, out: Path, metric: str, views: list[str], same: dict[str, dict[str, str]],
                  paper: PaperNumbers) -> Plot:
    """The headline of one run: per view, each client's value at the final round (a point each,
    over a box of their quartiles) and the run's mean over clients (a black line, its value
    printed above), so the views compare side by side with their spread over clients."""
    factor = scale(metric)
    col = colors({run.name: [run]})[run.name]
    fig = _new_figure(1.2 + 0.9 * len(views), 3.0)
    ax = fig.add_subplot()
    rng = np.random.default_rng(0)  # the points' jitter: the same every time
    drawn, counts, means = [], [], []
    for g, view in enumerate(views):
        clients = final_rows(run, view)[metric].dropna().to_numpy(float)
        counts.append(len(clients))
        if len(clients):
            box = ax.boxplot([factor * clients], positions=[g], widths=0.5, patch_artist=True, showfliers=False,
                             medianprops={"visible": False}, whis=(0, 100))
            for patch in box["boxes"]:
                patch.set(facecolor=col, alpha=0.2, edgecolor=col)
            ax.scatter(g + rng.uniform(-0.15, 0.15, len(clients)), factor * clients, s=7, color=col, lw=0,
                       alpha=0.85, zorder=3)
            drawn += list(clients)
        mean = _values([run], view, metric)
        if len(mean):
            ax.hlines(factor * mean[0], g - 0.32, g + 0.32, colors="black", lw=1.6, zorder=4)
            drawn.append(float(mean[0]))
            means.append((g, float(mean[0])))
        want = paper.values.get(run.name, {}).get((view, metric))
        if want is not None:
            ax.plot([g + 0.32], [factor * want], marker="*", color="black", markersize=8, ls="none", zorder=5)
            drawn.append(want)
    lo, hi, how = axis_range(metric, drawn)
    set_range(ax, lo, hi)
    for g, mean in means:
        ax.text(g, factor * mean + 0.015 * (hi - lo), fmt(metric, mean), ha="center", va="bottom",
                fontweight="bold", zorder=6,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.5})
    labels = [v + also_text(v, same).replace(" (", "\n(") + f"\nn = {k}" for v, k in zip(views, counts, strict=True)]
    ax.set_xticks(range(len(views)), labels)
    ax.set(xlim=(-0.5, len(views) - 0.5), ylabel=axis_label(metric),
           title=f"{run.name}, seed {run.seed}: {NAMES.get(metric, metric)}, round {run.summary.get('final_round')}")
    ax.grid(axis="y", alpha=0.3, zorder=0)
    fit_tick_labels(ax)
    _save(fig, out, "headline.png")
    merged = same_text(same)
    notes = (f"{NAMES.get(metric, metric)} at the run's final round (its last evaluated round), test split: per "
             f"view, each client's value (points; n clients under the view) over a box of their quartiles, whiskers "
             f"from the lowest to the highest, and the black line the run's {weighted([run])}, its value printed "
             "above. "
             + (f"Views that are the same model (identical values in every round and client), drawn once: "
                f"{merged}. " if merged else "")
             + (f"Star: the paper's number ({paper.source}). " if paper.values.get(run.name) else
                f"No paper number: {paper.none}. " if paper.none else "")
             + f"y axis {how}.")
    short = (f"{NAMES.get(metric, metric)} in each view at the final round, test split: each client a point, the "
             "line the mean over clients.")
    return Plot("headline.png", "headline", short, "headline", notes=notes)
