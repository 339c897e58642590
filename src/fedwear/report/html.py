"""One self-contained HTML page: summary tables and the figures embedded as base64 data URIs.

Every number of a table carries ``data-key`` and ``data-value`` (the exact value from
summary.json, or the statistic over seeds) so the page can be checked against its sources.
A small inline script marks ``<body data-images-ok="loaded/total">`` once the page has loaded.
"""

from __future__ import annotations

import base64
import json
import math
from html import escape
from pathlib import Path

import numpy as np

from fedwear import files
from fedwear.report.plots import Groups, Plot, flat, metrics_of, n_seeds, weighted
from fedwear.report.rundir import Run
from fedwear.report.tables import ordered_views
from fedwear.report.units import fmt, row_label, units_note

SECTIONS = {
    "headline": "Headline",
    "curves": "Metrics per round",
    "clients": "Per client, final round",
    "classes": "Per class: confusion matrices and F1",
    "cost": "Federated cost: the main metric against communication and time",
    "training": "Communication, training loss and time",
    "embeddings": "t-SNE of body embeddings",
    "forecast": "Heart rate over time: predicted and true, one client",
    "prototypes": "t-SNE of PCFedH encoder features, coloured by nearest prototype",
}
#: Sections whose figures each take a row of their own, at their own width.
WIDE = ("headline", "curves", "clients", "classes", "cost", "embeddings", "forecast", "prototypes")
#: Shown first, above the tables.
FIRST = ("headline",)

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto;
       max-width: 1500px; padding: 0 16px; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { margin-top: 32px; border-bottom: 1px solid #ddd; }
.meta { color: #555; font-size: 0.9em; } .meta code { font-size: 0.95em; }
table { border-collapse: collapse; margin: 8px 0 4px; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 9px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
tr.first td { border-top: 2px solid #999; }
.caption { font-size: 0.88em; color: #444; max-width: 1100px; margin-bottom: 12px; }
.grid { display: grid; grid-template-columns: repeat(var(--cols), minmax(0, 1fr)); gap: 18px;
        margin-bottom: 18px; }
@media (max-width: 900px) { .grid { grid-template-columns: minmax(0, 1fr); } }
figure { margin: 0; } figure img { width: 100%; height: auto; border: 1px solid #eee; }
figure.wide img { width: auto; max-width: 100%; }
figcaption { font-size: 0.85em; color: #444; margin-top: 4px; }
details { margin: 8px 0; } summary { cursor: pointer; font-weight: 600; }
details.how { font-size: 0.88em; color: #444; max-width: 1100px; } details.how dd { margin: 0 0 8px 16px; }
p.empty { color: #555; font-style: italic; }
"""

SCRIPT = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute("data-images-ok", ok + "/" + imgs.length);
});
"""


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _num(key: str, metric: str, value: float | None) -> str:
    """A number with its exact value in ``data-value`` (empty when missing)."""
    exact = "" if _missing(value) else repr(float(value))
    return f'<span data-key="{escape(key)}" data-value="{exact}">{fmt(metric, value)}</span>'


def _pm(key: str, metric: str, mean: float | None, std: float | None, n: int | None = None) -> str:
    """``mean ± std``; over a single value (``n`` = 1) the value alone: never a ``± 0.00`` that
    would read as no variance (the column or the caption says how many values there are)."""
    if _missing(mean):
        return "n/a"
    if n == 1:
        return _num(key + ".mean", metric, mean)
    return f"{_num(key + '.mean', metric, mean)} ± {_num(key + '.std', metric, std)}"


def _clients_at(run: Run, round: object, view: str) -> int | None:
    """Clients with a test-split row of ``view`` at ``round`` (None: the round is unknown)."""
    if round is None:
        return None
    m = run.metrics
    return int(((m["round"] == round) & (m["view"] == view) & (m["split"] == "test")).sum())


def _views_metrics(summaries: list[dict], metric_order: list[str]) -> tuple[list[str], list[str]]:
    """The views and metrics of the summaries' final and best rounds, in table order (metrics:
    those of ``metric_order`` first, in its order, then any others sorted)."""
    views = {v for s in summaries for sel in ("final", "best") for v in (s.get(sel) or {})}
    metrics = {m for s in summaries for sel in ("final", "best")
               for vals in (s.get(sel) or {}).values() for m in vals}
    return ordered_views(views), ([m for m in metric_order if m in metrics]
                                  + sorted(metrics - set(metric_order)))


def not_evaluated(run: Run) -> str:
    """What a run that evaluated no round shows in place of its numbers."""
    where = f" (the run {run.stopped_at})" if run.unfinished else ""
    return (f"No round evaluated yet{where}: metrics.csv holds no rows, so there is no "
            f"{', '.join(row_label(m) for m in run.metric_names) or 'metric'} to show.")


def run_table(run: Run, prefix: str = "") -> str:
    """Final and best round of one run: per view x metric, the sample-weighted mean over
    clients and the unweighted mean ± population std over clients (test split); a sentence
    instead when no round was evaluated."""
    s = run.summary
    if s.get("final_round") is None:
        return f'<p class="empty">{escape(not_evaluated(run))}</p>'
    views, metrics = _views_metrics([s], run.metric_names)
    head = (f'<tr><th class="l" rowspan="2">view</th><th class="l" rowspan="2">metric</th>'
            f'<th colspan="2">final (round {s.get("final_round")})</th>'
            f'<th colspan="2">best (round {s.get("best_round")})</th></tr>'
            "<tr>" + "<th>weighted mean</th><th>mean ± std</th>" * 2 + "</tr>")
    rows = []
    for view in views:
        for i, metric in enumerate(metrics):
            cells = []
            for sel in ("final", "best"):
                stats = (s.get(f"{sel}_stats") or {}).get(view, {}).get(metric) or {}
                weighted = (s.get(sel) or {}).get(view, {}).get(metric)
                key = f"{prefix}{sel}.{view}.{metric}"
                at = s.get("final_round") if sel == "final" else (s.get("best_rounds") or {}).get(view, s.get("best_round"))
                cells.append(f"<td>{_num(key + '.weighted', metric, weighted)}</td>")
                n = _clients_at(run, at, view)
                note = " <small>(1 client)</small>" if n == 1 else ""
                cells.append(f"<td>{_pm(key, metric, stats.get('mean'), stats.get('std'), n)}{note}</td>")
            rows.append(_row(view if i == 0 else "", metric, cells, first=i == 0))
    return f"<table>{head}{''.join(rows)}</table>"


def _row(view: str, metric: str, cells: list[str], first: bool) -> str:
    cls = ' class="first"' if first else ""
    return (f'<tr{cls}><td class="l">{escape(view)}</td>'
            f'<td class="l">{escape(row_label(metric))}</td>{"".join(cells)}</tr>')


def run_table_caption(run: Run) -> str:
    rule = run.summary.get("best_rule", "see summary.json")
    source = (f"from the CSV files written so far (no summary.json: the run is unfinished, {run.stopped_at}; "
              f"final: its last evaluated round so far)" if run.unfinished else "from summary.json")
    return (f"Test split, {source}. <b>weighted mean</b>: {weighted([run])}; <b>mean ± std</b>: "
            "unweighted mean over clients ± population std over clients (ddof=0); a view with one client "
            "(global_pooled) shows its value and n = 1 client. "
            f"Best round: {escape(rule)}. {units_note(run.metric_names)}.")


def _over_seeds(values: list) -> tuple[float | None, float | None, int]:
    v = np.array(values, dtype=float)  # None: NaN
    v = v[~np.isnan(v)]
    return (float(v.mean()), float(v.std()), len(v)) if len(v) else (None, None, 0)


def comparison_table(groups: Groups, select: str, reference: str | None = None) -> str:
    """Per view x metric (rows) and method (columns): mean ± population std over seeds of the
    per-seed sample-weighted means over clients at the ``select`` (final or best) round (one
    seed: its value alone; the column header gives each method's seeds); ``reference``'s column
    header says so; a sentence instead when no run evaluated a round."""
    if not any(r.evaluated for r in flat(groups)):
        return '<p class="empty">No round evaluated yet: no run\'s metrics.csv holds a row.</p>'
    views, metrics = _views_metrics([r.summary for r in flat(groups)], metrics_of(groups))
    head = ('<tr><th class="l">view</th><th class="l">metric</th>'
            + "".join(f"<th>{escape(m)} ({n_seeds(len(runs))}"
                      f"{', reference' if m == reference else ''})</th>"
                      for m, runs in groups.items()) + "</tr>")
    rows = []
    for view in views:
        for i, metric in enumerate(metrics):
            cells = []
            for method, runs in groups.items():
                vals = [(r.summary.get(select) or {}).get(view, {}).get(metric) for r in runs]
                mean, std, n = _over_seeds(vals)
                note = f" <small>({n} of {len(runs)} seeds)</small>" if 0 < n < len(runs) else ""
                cells.append(f"<td>{_pm(f'{select}.{method}.{view}.{metric}', metric, mean, std, n)}"
                             f"{note}</td>")
            rows.append(_row(view if i == 0 else "", metric, cells, first=i == 0))
    return f"<table>{head}{''.join(rows)}</table>"


def comparison_caption(select: str, groups: Groups) -> str:
    when = ("final round" if select == "final"
            else "best round of each seed (its summary.json best_round)")
    return (f"{when.capitalize()}, test split. Per seed the {weighted(flat(groups))}; cell: mean ± population "
            "std over seeds (ddof=0) of those per-seed values; a single seed's value stands alone, with no ± "
            "that would look like no variance; \"k of n seeds\" where some seed has none. "
            f"{units_note(metrics_of(groups))}.")


def figure(plot: Plot, out: Path) -> str:
    """``<figure>`` with the PNG embedded as a data URI and its caption."""
    data = base64.b64encode((out / plot.file).read_bytes()).decode("ascii")
    wide = ' class="wide"' if plot.section in WIDE and plot.section != "embeddings" else ""
    return (f'<figure{wide} id="{escape(plot.file)}"><img alt="{escape(plot.title)}" '
            f'data-file="{escape(plot.file)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{escape(plot.file)}</b>: {escape(plot.caption)}</figcaption></figure>")


def figures(plots: list[Plot], out: Path, empty: dict[str, str] | None = None,
            sections: tuple[str, ...] | None = None) -> str:
    """Figures grouped by section (``sections``: only those; default all); within a section, one
    grid row per ``Plot.row`` (a view). A section without figures is left out, or shows its
    sentence of ``empty`` (why it has none)."""
    parts = []
    for section, title in SECTIONS.items():
        if sections is not None and section not in sections:
            continue
        chosen = [p for p in plots if p.section == section]
        if not chosen:
            if section in (empty or {}):
                parts.append(f'<h2>{escape(title)}</h2><p class="empty">{escape(empty[section])}</p>')
            continue
        parts.append(f"<h2>{escape(title)}</h2>")
        if section in WIDE:
            parts.extend(figure(p, out) for p in chosen)
            continue
        rows = list(dict.fromkeys(p.row for p in chosen))
        cols = max(3, *(sum(p.row == r for p in chosen) for r in rows))
        for row in rows:
            body = "".join(figure(p, out) for p in chosen if p.row == row)
            parts.append(f'<div class="grid" style="--cols: {cols}">{body}</div>')
    return "".join(parts)


def how_to_read(plots: list[Plot]) -> str:
    """The page's one block of reading notes: per figure, how it is made and read."""
    items = "".join(f'<dt><a href="#{escape(p.file)}">{escape(p.file)}</a></dt><dd>{escape(p.notes)}</dd>'
                    for p in plots if p.notes)
    return f'<details class="how"><summary>How to read these figures</summary><dl>{items}</dl></details>' if items else ""


def page(title: str, meta: list[str], tables: str, plots: list[Plot], out: Path,
         empty: dict[str, str] | None = None) -> str:
    """The whole HTML document: the headline figure, the tables, then every other figure;
    ``meta`` items and ``tables`` are already HTML; ``empty``: see :func:`figures`."""
    items = "".join(f"<li>{m}</li>" for m in meta)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style>"
        f"<script>{SCRIPT}</script></head>\n<body>"
        f'<h1>{escape(title)}</h1><ul class="meta">{items}</ul>{how_to_read(plots)}'
        f"{figures(plots, out, empty, FIRST)}{tables}"
        f"{figures(plots, out, empty, tuple(s for s in SECTIONS if s not in FIRST))}</body></html>\n"
    )


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def privacy_and_cost(runs: list[Run]) -> str:
    """The (epsilon, delta) of the private runs (summary.json) and the on-device cost of the runs
    exported with ``fedwear export`` (``export/*.json``), beside the exported client's accuracy."""
    private = [[r.method, str(r.seed), f"{p['epsilon']:.3g}", f"{p['delta']:g}", f"{p['noise_multiplier']:.4g}",
                f"{p['clipping_norm']:g}", str(p["rounds"])]
               for r in runs if (p := r.summary.get("privacy") or {}).get("dp") == "central"]
    costs = []
    for r in runs:
        exported = [json.loads(f.read_text()) for f in sorted((r.path / files.EXPORT).glob("*.json"))]
        if meta := next((m for m in exported if "cost" in m), None):
            c = meta["cost"]
            score = f"{100 * c['fp32']:.2f}%" if c["metric"] == "accuracy" else f"{c['fp32']:.4g} MAE"
            costs.append([r.method, str(r.seed), str(meta["client"] or "global"), score, f"{c['parameters']:,}",
                          f"{c['macs_per_window']:,}", f"{c['bytes_fp32'] / 1024:.1f}", f"{c['bytes_int8'] / 1024:.1f}",
                          f"{c['latency_ms_fp32']:.3f}"])
    parts = []
    if private:
        parts.append("<h2>Privacy</h2>" + _table(
            ["method", "seed", "epsilon", "delta", "noise multiplier", "clipping norm", "rounds"], private)
            + '<div class="caption">Central DP per client: epsilon from dp-accounting\'s RDP accountant over '
              "the rounds run (docs/privacy.md).</div>")
    if costs:
        parts.append("<h2>On-device cost</h2>" + _table(
            ["method", "seed", "client", "its accuracy", "parameters", "MACs/window", "fp32 KiB", "int8 KiB",
             "ms/window"], costs)
            + '<div class="caption">The exported model of one client (<code>fedwear export</code>): its test '
              "score, and the median latency of one window through onnxruntime on one thread of the exporting "
              "machine.</div>")
    return "".join(parts)
