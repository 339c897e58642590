"""The results file of a reproduced forecasting table (PCFedH's Tables 2-4): per method the
mean ± std over clients at the final round, next to the paper's, with the naive forecasts.

PCFedH reports, per method, the unweighted mean ± std over clients of each client's MSE, MAE and
MAPE at the last round (pcfedh/pcfedh validators.py). Here each run gives the same (population std over clients,
``evaluation.client_weights: uniform``); a method's cell is the mean over its seeds of both, and
the naive rows (last value, client mean) come from the same runs' evaluation, so every table
shows what a model-free forecast scores on the same windows. A difference from the paper is
flagged where it exceeds the paper's own margin between its best and second-best method.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedwear.compare import Planned
from fedwear.config import KIND_METRICS
from fedwear.evaluation.naive import NAIVE
from fedwear.reproduce import Experiment, paper_table
from fedwear.reproduce.run_files import (
    cpu_cell,
    findings,
    matching_metrics,
    pm_cell,
    runs_cells,
)
from fedwear.rundir import RunFolder
from fedwear.summary import aggregate_metrics

METRICS = KIND_METRICS["regression"]
LABEL = {"mse": "MSE", "mae": "MAE", "mape": "MAPE (%)"}


#: how far back the "last rounds" column looks: a row that stops short of the paper's rounds shows
#: how much its MSE still moved over this many rounds before it stopped
DRIFT_ROUNDS = 50


def final_numbers(cfg, where: Path, at_round: int | None = None) -> dict | None:
    """Per view, the unweighted mean and population std over clients of each metric at the run's
    last evaluated round (test split), plus its rounds, CPU time and the personalized MSE's change
    since the last evaluated round at least ``DRIFT_ROUNDS`` earlier (``None`` without one)."""
    if (metrics := matching_metrics(cfg, where, at_round)) is None:
        return None
    agg = aggregate_metrics(metrics, "uniform")
    agg = agg[agg["split"] == "test"]
    final = int(agg["round"].max())
    last = agg[agg["round"] == final]
    views = {view: {r.metric: (float(r.mean), float(r.std)) for r in g.itertuples()}
             for view, g in last.groupby("view")}
    mse = agg[(agg["view"] == "personalized") & (agg["metric"] == "mse")].set_index("round")["mean"]
    earlier = mse[mse.index <= final - DRIFT_ROUNDS]
    drift = ((int(earlier.index[-1]), float(mse[final] - earlier.iloc[-1]))
             if len(earlier) and final in mse.index else None)
    return {"rounds": final, "of": cfg.rounds, "views": views, "cpu_s": RunFolder(where).cpu_s(at_round),
            "seed": cfg.seed, "drift": drift}


def forecast_lines(exp: Experiment, runs: list[Planned], by_method: dict[str, list[dict]],
                   at_round: int | None = None) -> list[str]:
    paper = paper_table(exp.paper) if exp.paper else {"rows": {}, "metrics": list(METRICS), "source": "none"}
    has_ref = bool(paper["rows"])
    # per metric, the gap between the paper's best and second-best method (its own margin)
    ranked = {m: sorted(row[i][0] for row in paper["rows"].values()) for i, m in enumerate(paper["metrics"])}
    margin = {m: v[1] - v[0] if len(v) > 1 else float("nan") for m, v in ranked.items()} if has_ref else {}
    head = " | ".join(f"{LABEL[m]} | paper | Δ" if has_ref else LABEL[m] for m in METRICS)
    lines = [
        f"Compared with: {paper['source']}." if has_ref else "No published numbers to compare with.", "",
        "Cells: each client's error on its own test windows at the last round, in bpm² (MSE), bpm (MAE) "
        "and % (MAPE); mean ± population std over clients (unweighted, as the paper), averaged over "
        "the seeds listed."
        + (" Δ = ours − paper; ⚠ where |Δ| exceeds the paper's own margin between its best and "
           "second-best method (" + ", ".join(f"{LABEL[m]} {v:.3f}" for m, v in margin.items()) + ")."
           if has_ref else ""),
        "",
        f"| Method | implementation | seeds | rounds run | {head} | MSE change over the last "
        f"{DRIFT_ROUNDS} rounds run | CPU-s (1 thread) |",
        "|" + "---|" * (4 + (3 if has_ref else 1) * len(METRICS) + 2),
    ]
    warned: set[str] = set()  # methods with a ⚠ in their row
    for method in exp.methods:
        got = by_method[method]
        ref = dict(zip(paper["metrics"], paper["rows"].get(method, []) or [], strict=False))
        cells = []
        for m in METRICS:
            ours = [c for n in got if (c := n["views"].get("personalized", {}).get(m)) is not None]
            cells.append(pm_cell(ours, 3))
            if has_ref:
                d = float(np.mean([c[0] for c in ours])) - ref[m][0] if m in ref and ours else None
                cells += [f"{ref[m][0]:.3f} ± {ref[m][1]:.3f}" if m in ref else "",
                          "" if d is None else f"{d:+.3f}" + (" ⚠" if abs(d) > margin[m] else "")]
        if any("⚠" in c for c in cells):
            warned.add(method)
        drift = ", ".join(f"{n['drift'][1]:+.3f} ({n['drift'][0]} -> {n['rounds']})"
                          for n in got if n["drift"]) or "-"
        lines.append(f"| {method} | {exp.variants.get(method, '')} | {runs_cells(method, got, runs, at_round)} | "
                     + " | ".join(cells)
                     + f" | {drift} | {cpu_cell([n['cpu_s'] for n in got])} |")
    lines += findings(exp, warned)
    naive = [n for runs_ in by_method.values() for n in runs_ if n["seed"] == min(r["seed"] for r in runs_)]
    if naive:
        lines += ["", "Naive forecasts on the same test windows (from the runs' evaluation; they do not "
                  "depend on the method):", "", "| forecast | " + " | ".join(LABEL[m] for m in METRICS) + " |",
                  "|" + "---|" * (1 + len(METRICS))]
        first = naive[0]["views"]
        lines += [f"| {view} | " + " | ".join(pm_cell([first[view][m]], 3) for m in METRICS) + " |"
                  for view in NAIVE if view in first]
    return lines


__all__ = ["final_numbers", "forecast_lines"]
