"""Tables in the shape of the papers': methods x (view, metric), mean +- std over seeds."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedwear.config import METRICS, VIEWS, RunConfig

LABEL = {"accuracy": "Acc", "macro_f1": "F1", "auc": "AUC"}


def over_clients(weights: str) -> str:
    """How a number was averaged over clients (``evaluation.client_weights``)."""
    if weights == "uniform":
        return "unweighted mean over clients"
    return f"sample-weighted mean over clients (weights: each client's {weights} windows)"


def summary_table(summary: dict) -> str:
    """Markdown table of one run's final round: per view and metric, the sample-weighted mean over
    clients on the test split (``summary["final"]``) in %, under a caption that says so."""
    lines = ["| view | " + " | ".join(LABEL[m] for m in METRICS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for view in VIEWS:
        vals = summary["final"].get(view)
        if vals:
            cells = [f"{100 * vals[m]:.2f}" if vals.get(m) is not None else "n/a" for m in METRICS]
            lines.append(f"| {view} | " + " | ".join(cells) + " |")
    caption = (
        f"final round {summary['final_round']}, test split: "
        f"{over_clients(summary.get('client_weights', 'test'))}, in %"
    )
    return caption + "\n" + "\n".join(lines)


def comparison_table(summaries: dict[str, list[dict]], select: str, cfg: RunConfig) -> tuple[str, pd.DataFrame]:
    """Markdown table and a long-form frame. Each cell is, over seeds, the mean ± population std
    (ddof=0) of the per-seed sample-weighted means over clients (test split), in %."""
    views = [v for v in VIEWS if any(v in s[select] for runs in summaries.values() for s in runs)]
    records = []
    header = ["Method"] + [f"{v} {LABEL[m]}" for v in views for m in METRICS]
    rows = []
    for method, runs in summaries.items():
        cells = [method]
        for v in views:
            for m in METRICS:
                vals = np.array([s[select].get(v, {}).get(m) for s in runs], dtype=float)
                vals = vals[~np.isnan(vals)] if len(vals) else vals
                if len(vals) == 0:
                    cells.append("n/a")
                    continue
                mean, std = 100 * vals.mean(), 100 * vals.std()
                cells.append(f"{mean:.2f} ± {std:.2f}")
                records.append({"method": method, "view": v, "metric": m, "mean": mean, "std": std, "seeds": len(vals)})
        rows.append("| " + " | ".join(cells) + " |")
    seeds = sorted({s["seed"] for runs in summaries.values() for s in runs})
    caption = (
        f"{cfg.dataset.name}, {cfg.rounds} rounds, split={cfg.dataset.split}, partition={cfg.dataset.partition}; "
        f"{select} round, test split; per seed the {over_clients(cfg.evaluation.client_weights)}, "
        "then mean ± population std (ddof=0) of those per-seed means "
        f"over seeds {seeds}; in %; AUC={cfg.evaluation.auc}"
    )
    md = "\n".join([caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows])
    return md, pd.DataFrame(records)
