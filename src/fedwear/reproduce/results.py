"""The results file of a reproduced table: ours next to the paper's, from the run folders.

Everything is read from each run's ``metrics.csv`` and ``timing.csv``, so a file can be written
while runs are still going: every row states the rounds it ran.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedwear.compare import Planned
from fedwear.config import task_kind
from fedwear.reproduce import Experiment, default_out, experiment, paper_table, plan
from fedwear.reproduce.budget_results import budget_lines, budget_numbers
from fedwear.reproduce.forecast_results import final_numbers, forecast_lines
from fedwear.reproduce.run_files import (
    FLAG,
    delta_cell,
    findings,
    header,
    matching_metrics,
    numbers_by_method,
    runs_cells,
    seed_cell,
    with_notes,
)
from fedwear.reproduce.views_results import view_numbers, views_lines
from fedwear.rundir import RunFolder
from fedwear.summary import aggregate_metrics, best_round

LABEL = {"accuracy": "Acc", "macro_f1": "F1", "auc": "AUC"}


def run_numbers(cfg, where: Path, at_round: int | None = None) -> dict | None:
    """Best-round and per-metric-best values (personalized view, test split, in %) of one run."""
    if (metrics := matching_metrics(cfg, where, at_round)) is None:
        return None
    ev = cfg.evaluation
    agg = aggregate_metrics(metrics, ev.client_weights)
    view = ev.best_metric.partition(".")[0]
    sel = agg[(agg["view"] == view) & (agg["split"] == "test")]
    best = best_round(agg, ev.best_metric, ev.best_split, ev.best_statistic)
    at_best = sel[sel["round"] == best].set_index("metric")["weighted"]
    final = sel[sel["round"] == sel["round"].max()].set_index("metric")["weighted"]
    own_best = sel.groupby("metric")["weighted"].max()
    curve = sel[sel["metric"] == "accuracy"].set_index("round")["weighted"]
    per_round, clock = float("nan"), "cpu"
    times = RunFolder(where).timing(at_round)
    if len(times):  # CPU-seconds; runs begun before timing.csv had cpu_s: wall seconds
        later = times[times["round"] > 0]
        if "cpu_s" in later and later["cpu_s"].notna().any():
            per_round = float(later["cpu_s"].median())
        else:
            per_round, clock = float(later["wall_s"].median()), "wall"
    return {"seed": cfg.seed, "rounds": int(metrics["round"].max()), "of": cfg.rounds, "best_round": best,
            **{key: {m: 100 * float(values.get(m, np.nan)) for m in LABEL}
               for key, values in (("at_best", at_best), ("own_best", own_best), ("final", final))},
            "curve": curve, "s_per_round": per_round, "clock": clock}


def rounds_to(curve: pd.Series, target: float) -> int | None:
    hit = curve[curve >= target]
    return int(hit.index.min()) if len(hit) else None


def reference_table(exp: Experiment) -> dict:
    """The numbers to compare with: the paper's, or our runs of the reference experiment."""
    if exp.paper:
        return paper_table(exp.paper)
    if exp.reference:
        ref = experiment(exp.reference)
        planned = plan(ref, default_out(ref), None)
        got = numbers_by_method(planned, ref.methods, run_numbers)
        rows = {m: [float(np.nanmean([n["at_best"][k] for n in runs])) for k in LABEL]
                for m, runs in got.items() if runs}
        split = planned[0][1].evaluation.best_split if planned else "test"
        return {"rows": rows, "metrics": list(LABEL), "label": "paper's protocol (ours)",
                "source": f"our runs of `fedwear reproduce {ref.key}` ({default_out(ref)}), best round on {split}"}
    return {"rows": {}, "metrics": list(LABEL), "source": "none"}


def write_results(exp: Experiment, runs: list[Planned], path: Path, command: str, out: Path,
                  at_round: int | None = None) -> str:
    """Write ``exp``'s results file at ``path`` from its runs, with the prose of the notes file beside
    it (``run_files.with_notes``); ``at_round``: each run as it stood at that round (rows compared
    at one budget). Below the common header, the table's shape: forecasting's, FedAli's views,
    Meta-HAR's budgets, or ProtoHAR's (:func:`table_lines`)."""
    exp = with_notes(exp, path)
    shapes = {"views": (view_numbers, views_lines), "budgets": (budget_numbers, budget_lines)}
    read, body = ((final_numbers, forecast_lines) if runs and task_kind(runs[0][1]) == "regression"
                  else shapes.get(exp.writer, (run_numbers, table_lines)))
    by_method = numbers_by_method(runs, exp.methods, read, at_round)
    text = "\n".join([*header(exp, command, out, at_round), *body(exp, runs, by_method, at_round)]) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def table_lines(exp: Experiment, runs: list[Planned], by_method: dict[str, list[dict]],
                at_round: int | None = None) -> list[str]:
    paper = reference_table(exp)
    ref_label = paper.get("label", "paper")
    has_ref = bool(paper["rows"])
    ev = runs[0][1].evaluation
    lines = [
        f"Compared with ({ref_label}): {paper['source']}." if has_ref else "No published numbers to compare with.",
        "",
        f"## Ours{' next to the ' + ref_label if has_ref else ''} (personalized view; each run's best round by "
        f"{ev.best_metric} on the {ev.best_split} split, {ev.client_weights}-weighted over clients)",
        "",
        "Cells: mean ± population std over the seeds listed, in %."
        + (f" Δ = ours − {ref_label}; ⚠ where |Δ| > {FLAG:g} points." if has_ref else ""),
        "",
        "| Method | implementation | seeds | rounds run | "
        + " | ".join(f"{LABEL[m]} | {ref_label} | Δ" if has_ref else LABEL[m] for m in LABEL)
        + " | best round | CPU-s/round (1 thread) |",
        "|" + "---|" * (5 + (3 if has_ref else 1) * len(LABEL) + 1),
    ]
    warned: set[str] = set()  # methods with a ⚠ in their row
    runs_of = {m: runs_cells(m, got, runs, at_round) for m, got in by_method.items()}
    for method in exp.methods:
        got = by_method[method]
        ref = dict(zip(paper["metrics"], paper["rows"].get(method, []) or [], strict=False))
        cells = []
        for m in LABEL:
            ours = [n["at_best"][m] for n in got]
            cells += [seed_cell(ours), f"{ref[m]:.2f}" if m in ref else "", delta_cell(ours, ref.get(m))] if has_ref \
                else [seed_cell(ours)]
        if any("⚠" in c for c in cells):
            warned.add(method)
        best = ", ".join(str(n["best_round"]) for n in got)
        speed = seed_cell([n["s_per_round"] for n in got]) + (" (wall s)" if any(n["clock"] == "wall" for n in got) else "")
        lines.append(f"| {method} | {exp.variants.get(method, '')} | {runs_of[method]} | " + " | ".join(cells)
                     + f" | {best} | {speed} |")
    lines += findings(exp, warned)
    for title, key in (("Each metric at its own best round (the maximum over rounds of each metric separately, "
                        "as the code's `ResultLogging.average_data` would report):", "own_best"),
                       ("Final round (no selection):", "final")):
        lines += ["", title, "", "| Method | seeds | rounds run | " + " | ".join(LABEL.values()) + " |",
                  "|" + "---|" * (3 + len(LABEL))]
        for method in exp.methods:
            if got := by_method[method]:
                lines.append(f"| {method} | {runs_of[method]} | "
                             + " | ".join(seed_cell([n[key][m] for n in got]) for m in LABEL) + " |")
    if exp.rounds_table:
        lines += _rounds_section(exp, by_method)
    return lines


def _rounds_section(exp: Experiment, by_method: dict[str, list[dict]]) -> list[str]:
    ref = paper_table(exp.rounds_table)
    lines = ["", "## Rounds to reach a target accuracy (seed 0)", "",
             f"Paper: {ref['source']}. The target is the best accuracy of the target method's seed-0 run; "
             "'never' = not reached in the rounds run.", ""]
    seed0 = {m: next((n for n in runs if n["seed"] == 0), None) for m, runs in by_method.items()}
    for key, target_method in (("fedavg_target", "fedavg"), ("fedrep_target", "fedrep")):
        if (base := seed0.get(target_method)) is None:
            continue
        target = float(base["curve"].max())
        base_rounds = rounds_to(base["curve"], target)
        lines += [f"Target: {target_method}'s best accuracy, {100 * target:.2f}%", "",
                  "| Method | rounds (ours) | speed-up | rounds (paper) |", "|---|---|---|---|"]
        methods = exp.methods if key == "fedavg_target" else (target_method, "protohar")
        for m in methods:
            if m not in ref[key] and m != target_method:
                continue
            run = seed0.get(m)
            r = rounds_to(run["curve"], target) if run else None
            ours = "not run" if run is None else ("never" if r is None else str(r))
            speed = f"{base_rounds / r:.2f}x" if r and base_rounds else ""
            paper_r = ref[key].get(m)
            lines.append(f"| {m} | {ours} | {speed} | {'never' if paper_r is None else paper_r} |")
        lines.append("")
    return lines


__all__ = ["write_results"]
