"""The results file of a table in FedAli's shape (its Tables 1 and 3): Personalization,
Generalization and Global per method, and the cost of each method relative to FedAvg.

FedAli's evaluation (getalp/FedAli): the best round is the one with the highest unweighted mean
personalization accuracy; Personalization and Generalization are the mean ± population std over
clients of macro-F1 at that round, on each client's own test split and on the pooled test split
of all clients; Global is the server model on the pooled test set at the round of its best
pooled accuracy (the code keeps both accuracy and macro-F1: both are shown). Methods without a
global model (FedPer, FedProto, FedPAC, Local) have no Global cell. Local keeps each client's
best epoch on its own test set (``evaluation.best_statistic: per_client``), flagged as selection
on test data. All three selections use the test split, as the paper's; a second table under
fedwear's leakage-free protocol, which makes them on a validation split (``evaluation.best_split``;
the cells' text says which), shows what that flatters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedwear import files
from fedwear.compare import Planned
from fedwear.config import EvaluationConfig
from fedwear.reproduce import Experiment, paper_table
from fedwear.reproduce.run_files import (
    context_section,
    matching_metrics,
    pm_cell,
    rounds_run,
    runs_cells,
    seed_cell,
)
from fedwear.rundir import RunFolder
from fedwear.summary import aggregate_metrics, best_round, per_client_best


def view_numbers(cfg, where: Path, at_round: int | None = None) -> dict | None:
    """Personalization / generalization macro-F1 (mean, std over clients) at the best round,
    the global view's pooled accuracy and macro-F1 at its own best round, and the run's cost."""
    if (metrics := matching_metrics(cfg, where, at_round)) is None:
        return None
    ev = cfg.evaluation
    agg = aggregate_metrics(metrics, ev.client_weights)
    test = agg[agg["split"] == "test"]
    trained = rounds_run(where, at_round) or int(metrics["round"].max())
    out: dict = {"rounds": trained, "of": cfg.rounds, "seed": cfg.seed,
                 "per_client": ev.best_statistic == "per_client"}
    if out["per_client"]:
        best = per_client_best(metrics, ev.best_metric, ev.best_split)
        out["best_round"] = "per client"
        for view in ("personalized", "generalization"):
            if view in best:
                out[view] = (100 * best[view]["macro_f1"]["mean"], 100 * best[view]["macro_f1"]["std"])
    else:
        r = best_round(agg, ev.best_metric, ev.best_split, ev.best_statistic)
        out["best_round"] = r
        for view in ("personalized", "generalization"):
            cell = test[(test["round"] == r) & (test["view"] == view) & (test["metric"] == "macro_f1")]
            if len(cell):
                out[view] = (100 * float(cell["mean"].iloc[0]), 100 * float(cell["std"].iloc[0]))
    if (test["view"] == "global_pooled").any():
        rule = ev.best_for.get("global_pooled", "global_pooled.accuracy")
        g = best_round(agg, rule, ev.best_split, "mean")
        at = test[(test["round"] == g) & (test["view"] == "global_pooled")].set_index("metric")["mean"]
        out["global"] = (100 * float(at["accuracy"]), 100 * float(at["macro_f1"]), g)
    out.update(_cost(where, at_round))
    return out


def _cost(where: Path, at_round: int | None) -> dict:
    """CPU seconds per training round (median), training bytes per round (mean, down + up) and
    the tensor bytes a client's method held while training (median of the rounds' largest)."""
    out = {"cpu_s": float("nan"), "bytes": float("nan"), "held": float("nan")}
    t = RunFolder(where).timing(at_round)
    if len(t):
        t = t[t["round"] > 0]
        if len(t) and "cpu_s" in t:
            out["cpu_s"] = float(t["cpu_s"].median())
    if (where / files.ROUNDS).exists():
        r = RunFolder(where).table(files.ROUNDS, at_round=at_round)
        r = r[r["round"] > 0]
        if len(r):
            out["bytes"] = float((r["bytes_down"] + r["bytes_up"]).mean())
            held = r["training_bytes"].dropna() if "training_bytes" in r else pd.Series(dtype=float)
            if (held > 0).any():  # 0: not measured (older runs, the batched engine's vectorised path)
                out["held"] = float(held[held > 0].median())
    return out


def views_lines(exp: Experiment, runs: list[Planned], by_method: dict[str, list[dict]],
                at_round: int | None = None) -> list[str]:
    lines = [
        _cells_text(runs[0][1].evaluation) if runs else "", "",
        "| Method | implementation | seeds | rounds run | best round | Personalization | "
        "Generalization | Global acc / F1 (round) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in exp.methods:
        got = by_method[method]
        best = ", ".join(str(n["best_round"]) for n in got)
        glob = [n["global"] for n in got if "global" in n]
        gcell = (f"{seed_cell([g[0] for g in glob])} / {seed_cell([g[1] for g in glob])} "
                 f"({', '.join(str(g[2]) for g in glob)})") if glob else "N/A"
        mark = " †" if any(n["per_client"] for n in got) else ""
        lines.append(
            f"| {method}{mark} | {exp.variants.get(method, '')} | {runs_cells(method, got, runs, at_round)} | "
            f"{best} | "
            f"{pm_cell([n['personalized'] for n in got if 'personalized' in n], 2)} | "
            f"{pm_cell([n['generalization'] for n in got if 'generalization' in n], 2)} | {gcell} |")
    lines += _cost_section(exp, by_method)
    if exp.paper:
        lines += context_section(paper_table(exp.paper))
    return lines


def _cells_text(ev: EvaluationConfig) -> str:
    """What a cell is, with the split every best round is chosen on (``evaluation.best_split``):
    the test split as the paper, or the leakage-free protocol's validation split."""
    on_test = ev.best_split == "test"
    split = {"test": "test split", "val": "validation split"}.get(ev.best_split, f"{ev.best_split} split")
    rule = ev.best_for.get("global_pooled", "global_pooled.accuracy")
    view, _, metric = rule.partition(".")
    glob = ("its best pooled accuracy" if rule == "global_pooled.accuracy"
            else f"the {view} view's best {metric} (unweighted mean over clients) on the {split}")
    flag = "selection on test data, as the paper" if on_test else "no selection on test data"
    return ("Cells: macro-F1 in %, mean ± population std over clients at the best round (the highest "
            f"unweighted mean personalization accuracy on the {split}), averaged over the seeds listed. "
            "Global: the server model on the pooled test set of all clients at the round of "
            f"{glob}, accuracy / macro-F1, ± population std over the seeds when there are several ({flag}). "
            f"† Local: each client's own best round on its {split} (the authors' ModelCheckpoint; {flag}).")


def _cost_section(exp: Experiment, by_method: dict[str, list[dict]]) -> list[str]:
    """FedAli's Table 3 shape: local training CPU, the memory a client's method holds and bytes per
    round, each relative to FedAvg."""
    keys = ("cpu_s", "held", "bytes")

    def mean(got: list[dict], key: str) -> float:
        v = np.array([n[key] for n in got], float)
        return float(np.nanmean(v)) if (~np.isnan(v)).any() else float("nan")

    def cell(value: float, scale: float, fmt: str) -> str:
        return "n/a" if np.isnan(value / scale) else fmt.format(value / scale)

    def ratio(value: float, scale: float) -> str:  # FedProto's bytes are ~0.001x: one significant digit
        return cell(value, scale, "{:.1g}×" if value / scale < 0.01 else "{:.2f}×")

    ref = {k: mean(by_method.get("fedavg") or [], k) for k in keys}
    lines = ["", "## Cost per round relative to FedAvg (FedAli's Table 3 shape)", "",
             "CPU: median CPU seconds of a round (all of the round's clients, one thread, the round's "
             "evaluation included), each run's own under the load it ran with; local training alone, "
             "all methods measured side by side in one run, is `results/bench_fedali_cost.md` "
             "(`benchmarks/fedali_cost.py` at commit e6cb47ba6e); memory: the tensors a client's method holds "
             "while it trains (its models, anchors and prototypes; not the data, optimiser state or activations: "
             "`training_bytes` in rounds.csv); bytes: training messages down + up per round. "
             "× FedAvg is n/a until FedAvg has run.", "",
             "| Method | seeds | rounds run | CPU-s / round | × FedAvg | memory MB | × FedAvg | MB / round | × FedAvg |",
             "|---|---|---|---|---|---|---|---|---|"]
    for method, got in by_method.items():
        if not got:
            continue
        v = {k: mean(got, k) for k in keys}
        seeds = ",".join(str(n["seed"]) for n in got)
        rounds = ", ".join(f"{n['rounds']}/{n['of']}" for n in got)
        lines.append(
            f"| {method} | {seeds} | {rounds} | {cell(v['cpu_s'], 1, '{:.1f}')} | {ratio(v['cpu_s'], ref['cpu_s'])} | "
            f"{cell(v['held'], 1e6, '{:.2f}')} | {ratio(v['held'], ref['held'])} | "
            f"{cell(v['bytes'], 1e6, '{:.2f}')} | {ratio(v['bytes'], ref['bytes'])} |")
    return lines


__all__ = ["view_numbers", "views_lines"]
