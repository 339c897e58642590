"""PNG figures of runs grouped by method, each with a caption saying exactly what it shows.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot, no global backend switch).
A single run is the group ``{method: [run]}``; in a comparison the line of a method is the mean
over its seeds and the band spans min..max over seeds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from fedwear.config import METRICS
from fedwear.report.rundir import Run
from fedwear.report.tables import ordered_views
from fedwear.report.units import NAMES, axis_label, scale

Groups = dict[str, list[Run]]


def flat(groups: Groups) -> list[Run]:
    return [run for runs in groups.values() for run in runs]
DPI = 110
def weighted(runs: Iterable[Run]) -> str:
    """How the runs' weighted means were taken over clients (``evaluation.client_weights``)."""
    how = {run.client_weights for run in runs}
    if how == {"uniform"}:
        return "unweighted mean over clients"
    if len(how) == 1:
        return f"sample-weighted mean over clients (weights: each client's {how.pop()} windows)"
    return "weighted mean over clients (weights: each run's evaluation.client_weights)"


@dataclass
class Plot:
    """One PNG written to the report folder and the text that goes with it."""

    file: str
    title: str
    caption: str
    section: str
    row: str = ""


def colors(groups: Groups) -> dict[str, str]:
    """A fixed colour per method (matplotlib's tab10 cycle, in group order)."""
    return {m: f"C{i % 10}" for i, m in enumerate(groups)}


def styles(groups: Groups) -> dict[str, dict]:
    """Colour and marker per method; earlier methods get larger markers, so the points of
    lines that coincide still show each method."""
    marks, n = "osD^vP<>Xp", len(groups)
    return {m: {"color": f"C{i % 10}", "marker": marks[i % 10],
                "size": 4 + min(2 * (n - 1 - i), 5)} for i, m in enumerate(groups)}


def views_of(groups: Groups) -> list[str]:
    """Views present on the test split of any run, in fedwear's order (the naive forecasts of a
    regression run after the evaluation views), then any others."""
    seen = {str(v) for runs in groups.values() for r in runs
            for v in r.metrics.loc[r.metrics["split"] == "test", "view"].unique()}
    return ordered_views(seen)


def metrics_of(groups: Groups) -> list[str]:
    """Metric columns of any run, first-seen order."""
    names: list[str] = []
    for runs in groups.values():
        for r in runs:
            names += [m for m in r.metric_names if m not in names]
    return names


def seeds_text(groups: Groups) -> str:
    """``fedavg: seeds 0, 1; local: seeds 0, 1`` (or ``seed 0`` for one run)."""
    parts = []
    for method, runs in groups.items():
        seeds = ", ".join(str(r.seed) for r in runs)
        parts.append(f"{method}: seed{'s' if len(runs) > 1 else ''} {seeds}")
    return "; ".join(parts)


def multi_seed(groups: Groups) -> bool:
    return any(len(runs) > 1 for runs in groups.values())


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, out: Path, file: str) -> None:
    fig.savefig(out / file, dpi=DPI, metadata={"Software": None})


def _seed_band(series: list[pd.Series]) -> pd.DataFrame:
    """Per round (index): mean, min and max over the seeds' values (NaN ignored)."""
    table = pd.concat(series, axis=1)
    return pd.DataFrame({"mean": table.mean(axis=1), "lo": table.min(axis=1),
                         "hi": table.max(axis=1)})


def _draw_band(ax, stats: pd.DataFrame, style: dict, label: str, factor: float = 1.0,
               ls: str = "-") -> None:
    """The mean line (a marker on each point; see :func:`_thin_markers`) and, when seeds differ,
    the min..max band."""
    stats = stats.dropna(subset=["mean"])
    x = stats.index.to_numpy(float)
    color = style["color"]
    ax.plot(x, factor * stats["mean"], color=color, marker=style["marker"], markersize=style["size"],
            lw=1.6, ls=ls, label=label)
    if (stats["hi"] > stats["lo"]).any():
        ax.fill_between(x, factor * stats["lo"], factor * stats["hi"], color=color, alpha=0.18,
                        lw=0)


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
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol,
                   frameon=False, fontsize=9)


def _weighted_series(run: Run, view: str, metric: str) -> pd.Series:
    agg = run.aggregated
    sel = agg[(agg["view"] == view) & (agg["split"] == "test") & (agg["metric"] == metric)]
    return sel.set_index("round")["weighted"].astype(float).rename(str(run.seed))


def curve_plots(groups: Groups, out: Path) -> list[Plot]:
    """One figure per (view, metric): the test-split metric per evaluated round."""
    plots, sty = [], styles(groups)
    band = multi_seed(groups)
    for view in views_of(groups):
        for metric in metrics_of(groups):
            lines = {}
            for method, runs in groups.items():
                series = [_weighted_series(r, view, metric) for r in runs]
                series = [s for s in series if s.notna().any()]
                if series:
                    lines[method] = _seed_band(series)
            if not lines:
                continue
            fig = _new_figure(4.8, 3.5 if len(groups) > 1 else 3.2)
            ax = fig.add_subplot()
            for method, stats in lines.items():
                _draw_band(ax, stats, sty[method], method, scale(metric))
            ax.set(xlabel="round", ylabel=axis_label(metric),
                   title=f"{view}: {NAMES.get(metric, metric)}")
            ax.title.set_fontsize(10)
            ax.grid(alpha=0.3)
            ax.xaxis.get_major_locator().set_params(integer=True)
            _thin_markers(ax)
            _legend(fig, ax, groups)
            file = f"curve-{view}-{metric}.png"
            _save(fig, out, file)
            what = f"{NAMES.get(metric, metric)}, {view} view, test split, at each evaluated round"
            drawn = {m: groups[m] for m in lines}
            if band:
                caption = (f"{what}. Line: mean over seeds of each seed's {weighted(flat(drawn))}; shaded band: "
                           f"min..max over seeds of that per-seed value ({seeds_text(drawn)}).")
            else:
                caption = f"{what}: {weighted(flat(drawn))}. Runs: {seeds_text(drawn)}."
            title = f"{view}: {NAMES.get(metric, metric)}"
            plots.append(Plot(file, title, caption, "curves", view))
    return plots


def _by_view(run: Run, round: int | None) -> dict[str, pd.DataFrame]:
    """Test-split rows of ``round`` per view, indexed by client id (as text)."""
    m = run.metrics
    sel = m[(m["round"] == round) & (m["split"] == "test")].astype({"client": str})
    return {str(view): g.set_index("client") for view, g in sel.groupby("view")}


def _round_text(groups: Groups, key: str) -> str:
    rounds = {method: runs[0].summary.get(key) for method, runs in groups.items()}
    if len(set(rounds.values())) == 1:
        return f"round {next(iter(rounds.values()))}"
    return "rounds " + ", ".join(f"{m} {r}" for m, r in rounds.items())


def _client_bars(ax, names: list[str], at: dict[str, pd.DataFrame], metric: str,
                 col: dict[str, str]) -> None:
    """Bars per client (grouped by method) and a dashed line at each method's weighted mean."""
    present = {m: f for m, f in at.items() if f[metric].notna().any()}
    k, x, factor = max(1, len(present)), np.arange(len(names)), scale(metric)
    for idx, (method, f) in enumerate(present.items()):
        offset = (idx - (k - 1) / 2) * 0.8 / k
        y = f[metric].reindex(names).to_numpy(float)
        ax.bar(x + offset, factor * y, width=0.8 / k, color=col[method])
        for xi in (x + offset)[np.isnan(y) & np.isin(names, f.index)]:
            ax.text(xi, 0, "n/a", ha="center", va="bottom", rotation=90, fontsize=7, color="#555")
        v, w = f[metric].to_numpy(float), f["n"].to_numpy(float)
        ok = ~np.isnan(v)
        if w[ok].sum() > 0:
            ax.axhline(factor * np.average(v[ok], weights=w[ok]), color=col[method], ls="--", lw=1)
    sizes = {}
    for f in at.values():
        for c, n in f["n"].items():
            sizes.setdefault(c, set()).add(int(n))
    rotate = len(names) > 8
    sep = " " if rotate else "\n"
    labels = [f"{c}{sep}n={next(iter(sizes[c]))}" if len(sizes.get(c, ())) == 1 else c
              for c in names]
    ax.set_xticks(x, labels, rotation=90 if rotate else 0, fontsize=7)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.grid(axis="y", alpha=0.3)
    ax.tick_params(axis="y", labelsize=8)


def client_plots(groups: Groups, out: Path) -> list[Plot]:
    """One figure per metric: per-client bars at the final and best rounds, one row per view."""
    plots, col = [], colors(groups)
    reps = {method: runs[0] for method, runs in groups.items()}
    keys = ("final_round", "best_round")
    rows_at = {key: {m: _by_view(r, r.summary.get(key)) for m, r in reps.items()} for key in keys}
    rules = {r.summary.get("best_rule") for r in reps.values()} - {None}
    for metric in metrics_of(groups):
        clients = {}
        for view in views_of(groups):
            frames = [f[view] for at in rows_at.values() for f in at.values()
                      if view in f and metric in f[view] and f[view][metric].notna().any()]
            if frames:
                clients[view] = sorted(set().union(*(f.index for f in frames)))
        if not clients:
            continue
        most = max(len(c) for c in clients.values())
        width = min(16.0, max(9.0, 2 * (1.2 + 0.14 * most * len(reps))))
        fig = _new_figure(width, 0.5 + 2.2 * len(clients))
        # % metrics share one 0..100 axis; errors (bpm, bpm²) differ by orders of magnitude between
        # a model and the naive forecasts, so each view (row) gets its own
        axes = fig.subplots(len(clients), 2, squeeze=False, sharey=True if metric in METRICS else "row")
        for i, (view, names) in enumerate(clients.items()):
            for j, key in enumerate(keys):
                at = {m: f[view] for m, f in rows_at[key].items()
                      if view in f and metric in f[view]}
                _client_bars(axes[i, j], names, at, metric, col)
                axes[i, j].set_title(f"{view}: {key.split('_')[0]} ({_round_text(groups, key)})",
                                     fontsize=9)
            axes[i, 0].set_ylabel(axis_label(metric), fontsize=8)
        if len(reps) > 1:
            fig.legend([Patch(color=col[m]) for m in reps], list(reps), loc="outside lower center",
                       ncol=min(len(reps), 4), frameon=False, fontsize=9)
        file = f"clients-{metric}.png"
        _save(fig, out, file)
        which = ("the run with the lowest seed of each method, not a mean over seeds ("
                 + ", ".join(f"{m}: seed {r.seed}" for m, r in reps.items()) + ")"
                 if len(groups) > 1 or multi_seed(groups) else seeds_text(groups))
        rule = f"; best = {'; '.join(sorted(rules))}" if rules else ""
        caption = (f"{NAMES.get(metric, metric)} of each client on the test split, one row per "
                   f"view: final round (left) and best round (right{rule}). Bars: one per client"
                   f"{' and method' if len(groups) > 1 else ''}, n/a where the metric is "
                   "undefined; "
                   f"dashed line: {weighted(reps.values())}. "
                   f"Runs: {which}.")
        plots.append(Plot(file, f"per client: {NAMES.get(metric, metric)}", caption, "clients"))
    return plots


def _round_series(run: Run, column: str, cumulative: bool = False) -> pd.Series:
    if column not in run.rounds:
        return pd.Series(dtype=float, name=str(run.seed))
    s = run.rounds.set_index("round")[column].astype(float)
    return (s.cumsum() if cumulative else s).rename(str(run.seed))


def _across_seeds(groups: Groups) -> str:
    return ("Line: mean over seeds; shaded band: min..max over seeds "
            f"({seeds_text(groups)})" if multi_seed(groups) else f"Runs: {seeds_text(groups)}")


def bytes_plot(groups: Groups, out: Path, way: str) -> Plot:
    """Cumulative bytes ``way`` ("up" or "down") in MB; evaluation traffic dashed when
    rounds.csv records it."""
    has_eval = any(f"eval_bytes_{way}" in r.rounds for rs in groups.values() for r in rs)
    fig = _new_figure(4.8, 3.5 if len(groups) > 1 or has_eval else 3.2)
    ax = fig.add_subplot()
    sty = styles(groups)
    kinds = [("", "-", "training")] + ([("eval_", "--", "evaluation")] if has_eval else [])
    for method, rs in groups.items():
        for prefix, ls, kind in kinds:
            series = [_round_series(r, f"{prefix}bytes_{way}", True) for r in rs]
            series = [x for x in series if len(x)]
            if series:
                label = f"{method}, {kind}" if has_eval else method
                _draw_band(ax, _seed_band(series), sty[method], label, 1e-6, ls)
    direction = "clients to server" if way == "up" else "server to clients"
    ax.set(xlabel="round", ylabel="cumulative MB", title=f"bytes {way}: {direction}")
    ax.title.set_fontsize(10)
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    _thin_markers(ax)
    _legend(fig, ax, groups, always=has_eval)
    file = f"bytes_{way}.png"
    _save(fig, out, file)
    what = ("training replies accepted into aggregation" if way == "up"
            else "training payloads sent to the selected clients")
    caption = (f"Cumulative bytes_{way} per round from rounds.csv ({what}), summed over clients, "
               "in MB (10^6 bytes)")
    if has_eval:
        caption += (f"; dashed: eval_bytes_{way}, the evaluation traffic of evaluated rounds "
                    "(see bytes_notes in summary.json)")
    return Plot(file, f"bytes {way}", f"{caption}. {_across_seeds(groups)}.", "training",
                "communication")


def _line_plot(groups: Groups, out: Path, file: str, series: dict[str, list[pd.Series]],
               ylabel: str, title: str) -> None:
    fig = _new_figure(4.8, 3.5 if len(groups) > 1 else 3.2)
    ax = fig.add_subplot()
    sty = styles(groups)
    drawn = False
    for method, per_seed in series.items():
        per_seed = [s for s in per_seed if s.notna().any()]
        if per_seed:
            _draw_band(ax, _seed_band(per_seed), sty[method], method)
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no values recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set(xlabel="round", ylabel=ylabel, title=title)
    ax.title.set_fontsize(10)
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    _thin_markers(ax)
    _legend(fig, ax, groups)
    _save(fig, out, file)


def loss_plot(groups: Groups, out: Path) -> Plot:
    """Training loss per round (rounds.csv ``train_loss``)."""
    series = {m: [_round_series(r, "train_loss") for r in runs] for m, runs in groups.items()}
    _line_plot(groups, out, "train_loss.png", series, "train loss", "training loss")
    caption = ("train_loss from rounds.csv: per round, the unweighted mean over the clients whose "
               "reply was accepted of the training loss each reported (rounds without a reported "
               f"loss are left out). {_across_seeds(groups)}.")
    return Plot("train_loss.png", "training loss", caption, "training", "training")


def timing_plot(groups: Groups, out: Path) -> Plot:
    """Wall-clock seconds per round (timing.csv)."""
    series = {m: [r.timing.set_index("round")["wall_s"].astype(float).rename(str(r.seed))
                  for r in runs] for m, runs in groups.items()}
    _line_plot(groups, out, "wall_time.png", series, "seconds", "wall-clock time per round")
    caption = ("wall_s from timing.csv: seconds per round, training plus evaluation when the round "
               f"was evaluated. {_across_seeds(groups)}.")
    return Plot("wall_time.png", "wall-clock time", caption, "training", "training")


def all_plots(groups: Groups, out: Path) -> list[Plot]:
    """Every figure of the report, written to ``out``."""
    return [*curve_plots(groups, out), *client_plots(groups, out),
            bytes_plot(groups, out, "up"), bytes_plot(groups, out, "down"),
            loss_plot(groups, out), timing_plot(groups, out)]
