"""Tables in the shape of the papers': methods x (view, metric), mean +- std over seeds."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedwear.config import KIND_METRICS, VIEWS, RunConfig
from fedwear.data import dataset_label
from fedwear.evaluation.naive import NAIVE
from fedwear.report.units import REGRESSION_NOTE, fmt

LABEL = {"accuracy": "Acc", "macro_f1": "F1", "auc": "AUC", "mse": "MSE", "mae": "MAE", "mape": "MAPE (%)"}
#: Views in table order: the evaluation views, then the naive forecasts of a regression run.
TABLE_VIEWS = (*VIEWS, *NAIVE)


def ordered_views(seen) -> list[str]:
    """``seen`` views in table order; a fine-tuning budget's views (``personalized@n2``) follow
    their base view, budgets in name order; unknown views last."""
    def key(view: str) -> tuple:
        base, _, budget = view.partition("@")
        return (TABLE_VIEWS.index(base) if base in TABLE_VIEWS else len(TABLE_VIEWS), base, budget)
    return sorted(set(seen), key=key)


def task_metrics(views: list[dict]) -> tuple[str, ...]:
    """The metrics of the task the ``{metric: value}`` dicts come from (classification's or
    regression's, ``config.KIND_METRICS``)."""
    seen = {m for v in views for m in v}
    return KIND_METRICS["regression" if "mse" in seen else "classification"]


def in_percent(metrics: tuple[str, ...]) -> bool:
    return metrics == KIND_METRICS["classification"]


def over_clients(weights: str) -> str:
    """How a number was averaged over clients (``evaluation.client_weights``)."""
    if weights == "uniform":
        return "unweighted mean over clients"
    return f"sample-weighted mean over clients (weights: each client's {weights} windows)"


def summary_table(summary: dict) -> str:
    """Markdown table of one run's final round: per view, the number of clients ``n`` its values
    cover and per metric the sample-weighted mean over them on the test split
    (``summary["final"]``), classification in %, regression in the units of heart rate
    (:data:`~fedwear.report.units.REGRESSION_NOTE`), under a caption that says so; below it, the
    clients missing from the final (or a best) round, whom those means leave out. A run that
    evaluated no round gets one line saying so."""
    final = summary["final"]
    kind = summary.get("task")  # absent from the summaries of older runs: read off the values
    metrics = KIND_METRICS[kind] if kind in KIND_METRICS else task_metrics(list(final.values()))
    if summary.get("final_round") is None:
        names = ", ".join(LABEL[m] for m in metrics)
        return f"no round was evaluated: no test-split {names} to show"
    counts = summary.get("n_clients", {}).get("final")  # older summaries: no n column
    missing = summary.get("missing", {})
    gone = missing.get("final", {})
    head = ["view", *(["n"] if counts is not None else []), *(LABEL[m] for m in metrics)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for view in ordered_views([*final, *gone]):
        vals = final.get(view) or {}
        if vals or view in gone:
            n = [str(counts.get(view, 0))] if counts is not None else []
            cells = [*n, *(fmt(m, vals.get(m)) for m in metrics)]
            lines.append(f"| {view} | " + " | ".join(cells) + " |")
    unit = "in %" if in_percent(metrics) else REGRESSION_NOTE
    caption = (f"final round {summary['final_round']}, test split: "
               f"{over_clients(summary.get('client_weights', 'test'))}, {unit}")
    notes = []
    if gone:
        notes.append(f"missing from round {summary['final_round']} (evaluated in other rounds; "
                     "the means are over the others): " + _named(gone))
    rounds = summary.get("best_rounds", {})
    best = {v: ids for v, ids in missing.get("best", {}).items()  # a best round that is the final one: above
            if rounds.get(v) != summary["final_round"]}
    if best:
        notes.append("missing from the best round: " + _named(best, rounds))
    return "\n".join([caption, *lines, *notes])


def _named(missing: dict[str, list[str]], rounds: dict[str, int] | None = None) -> str:
    """``view: a, b; view2 (round 3): c`` in table order (with each view's round when given)."""
    rounds = rounds or {}
    return "; ".join(f"{v}{f' (round {rounds[v]})' if v in rounds else ''}: {', '.join(missing[v])}"
                     for v in ordered_views(missing))


def rounds_read(runs: list[dict], select: str) -> str:
    """The round each run's numbers are read at (``final`` or ``best``), once when all agree."""
    got = [str(s["final_round"] if select == "final" else s["best_round"]) for s in runs]
    return got[0] if len(set(got)) == 1 else ", ".join(got)


def comparison_table(summaries: dict[str, list[dict]], select: str, cfg: RunConfig,
                     tests: dict | None = None) -> tuple[str, pd.DataFrame]:
    """Markdown table and a long-form frame. Each cell is, over seeds, the mean ± population std
    (ddof=0) of the per-seed sample-weighted means over clients (test split), or the value alone
    when only one seed has one (``(k of n seeds)`` where fewer seeds than the row's have a value),
    classification in %, regression as :data:`~fedwear.report.units.REGRESSION_NOTE` says.
    ``tests`` (``reproduce.claims.tests_against``) adds each method's paired test against a
    reference."""
    views = ordered_views(v for runs in summaries.values() for s in runs for v in s[select])
    metrics = task_metrics([vals for runs in summaries.values() for s in runs for vals in s[select].values()])
    factor = 100.0 if in_percent(metrics) else 1.0
    records = []
    header = ["Method", "seeds", "round"] + [f"{v} {LABEL[m]}" for v in views for m in metrics]
    rows = []
    for method, runs in summaries.items():
        cells = [method, ", ".join(str(s["seed"]) for s in runs), rounds_read(runs, select)]
        for v in views:
            for m in metrics:
                vals = np.array([s[select].get(v, {}).get(m) for s in runs], dtype=float)
                vals = vals[~np.isnan(vals)]
                if len(vals) == 0:
                    cells.append("n/a")
                    continue
                mean, std = factor * vals.mean(), factor * vals.std()
                shown = f"{mean:.2f}" if factor == 100.0 else f"{mean:.4g}"
                # one value has no spread to show ("± 0.00" would read as zero variance): it stands alone,
                # the seeds column says whose it is, and a cell with fewer seeds than its row says how many
                spread = "" if len(vals) == 1 else f" ± {std:.2f}" if factor == 100.0 else f" ± {std:.3g}"
                fewer = f" ({len(vals)} of {len(runs)} seeds)" if len(vals) < len(runs) else ""
                cells.append(f"{shown}{spread}{fewer}")
                records.append({"method": method, "view": v, "metric": m, "mean": mean, "std": std, "seeds": len(vals)})
        if tests:
            t = tests["rows"].get(method)
            cells += [f"{t['effect']:+.3g} [{t['low']:+.3g}, {t['high']:+.3g}]", f"{t['p_holm']:.3g}",
                      f"{t['seeds']} x {t['n']}"] if t else ["reference", "", ""]
            if t:
                records.append({"method": method, "view": tests["view"], "metric": f"{tests['metric']} vs {tests['reference']}",
                                "mean": t["effect"], "low": t["low"], "high": t["high"], "p_holm": t["p_holm"], "clients": t["n"],
                                "seeds": t["seeds"]})
        rows.append("| " + " | ".join(cells) + " |")
    if tests:
        header += [f"Δ {tests['view']} {LABEL[tests['metric']]} vs {tests['reference']} [95% CI]",
                   "p (Holm)", "seeds x clients"]
    seeds = sorted({s["seed"] for runs in summaries.values() for s in runs})
    caption = (
        f"{dataset_label(cfg.dataset)}, {cfg.rounds} rounds, split={cfg.dataset.split}, "
        f"partition={cfg.dataset.partition}; "
        f"{select} round, test split; per seed the {over_clients(cfg.evaluation.client_weights)}, "
        "then mean ± population std (ddof=0) of those per-seed means "
        f"over seeds {seeds} (a value without ± is one seed's); "
        + (f"in %; AUC={cfg.evaluation.auc}" if factor == 100.0 else REGRESSION_NOTE)
    )
    if tests:
        caption += (f"; Δ: each method minus {tests['reference']} in {tests['view']} {tests['metric']} (positive: better), "
                    "paired by (seed, client) at the same round, the mean of the clients' seed-averaged differences "
                    f"with its 95% interval; test: {tests['test']}, as `fedwear reproduce --claims` tests claims "
                    "(seeds replicate training, clients are the test population; one seed decides nothing: p n/a), "
                    "two-sided p Holm-corrected over the methods")
    md = "\n".join([caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows])
    return md, pd.DataFrame(records)
