"""summary.json from a run directory's CSV files (so a resumed run gets the same summary)."""

from __future__ import annotations

import math

import pandas as pd

from fedwear.config import METRICS, RunConfig
from fedwear.evaluation.metrics import summarize


def metric_columns(metrics: pd.DataFrame) -> list[str]:
    """The metric columns of a metrics.csv frame: every numeric column but the ids and ``n``,
    the classification metrics first (in ``METRICS`` order), then the others in frame order."""
    ids = ("round", "client", "view", "split", "n")
    cols = [c for c in metrics.columns if c not in ids and pd.api.types.is_numeric_dtype(metrics[c])]
    return [m for m in METRICS if m in cols] + [c for c in cols if c not in METRICS]


def aggregate_metrics(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per (round, view, split, metric) with weighted / mean / std / worst10 over clients."""
    out = []
    names = metric_columns(metrics)
    for (r, view, split), g in metrics.groupby(["round", "view", "split"], sort=True):
        for metric in names:
            s = summarize(g[metric].to_numpy(float), g["n"].to_numpy(float))
            out.append({"round": r, "view": view, "split": split, "metric": metric, **s, "clients": len(g)})
    return pd.DataFrame(out, columns=["round", "view", "split", "metric", "weighted", "mean", "std", "worst10", "clients"])


def _clean(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _at(agg: pd.DataFrame, round: int, stat: str = "weighted") -> dict[str, dict[str, float | None]]:
    sel = agg[(agg["round"] == round) & (agg["split"] == "test")]
    out: dict[str, dict[str, float | None]] = {}
    for row in sel.itertuples():
        out.setdefault(row.view, {})[row.metric] = _clean(getattr(row, stat))
    return out


def _stats_at(agg: pd.DataFrame, round: int) -> dict[str, dict[str, dict[str, float | None]]]:
    sel = agg[(agg["round"] == round) & (agg["split"] == "test")]
    out: dict = {}
    for row in sel.itertuples():
        out.setdefault(row.view, {})[row.metric] = {
            k: _clean(getattr(row, k)) for k in ("weighted", "mean", "std", "worst10")
        }
    return out


def build_summary(cfg: RunConfig, metrics: pd.DataFrame, rounds: pd.DataFrame, wall_time_s: float,
                  version: str) -> dict:
    agg = aggregate_metrics(metrics)
    ev = cfg.evaluation
    view, _, metric = ev.best_metric.partition(".")
    evaluated = sorted(agg["round"].unique().tolist())
    final_round = int(evaluated[-1]) if evaluated else None
    crit = agg[(agg["view"] == view) & (agg["metric"] == metric) & (agg["split"] == ev.best_split)]
    crit = crit.dropna(subset=["weighted"])
    best_round = int(crit.loc[crit["weighted"].idxmax(), "round"]) if len(crit) else final_round
    rounds_to_target = {}
    for key, target in ev.targets.items():
        tv, _, tm = key.partition(".")
        hit = agg[(agg["view"] == tv) & (agg["metric"] == tm) & (agg["split"] == "test") & (agg["weighted"] >= target)]
        rounds_to_target[key] = int(hit["round"].min()) if len(hit) else None
    return {
        "method": cfg.method,
        "final": _at(agg, final_round) if final_round else {},
        "best": _at(agg, best_round) if best_round else {},
        "best_rule": f"round with max sample-weighted {ev.best_metric} on the {ev.best_split} split",
        "best_round": best_round,
        "final_round": final_round,
        "final_stats": _stats_at(agg, final_round) if final_round else {},
        "best_stats": _stats_at(agg, best_round) if best_round else {},
        "rounds_to_target": rounds_to_target,
        "bytes_up": int(rounds["bytes_up"].sum()) if len(rounds) else 0,
        "bytes_down": int(rounds["bytes_down"].sum()) if len(rounds) else 0,
        "eval_bytes_up": int(rounds["eval_bytes_up"].sum()) if len(rounds) else 0,
        "eval_bytes_down": int(rounds["eval_bytes_down"].sum()) if len(rounds) else 0,
        "failed_rounds": [int(r) for r in rounds.loc[rounds["aggregated"] == 0, "round"]],
        "wall_time_s": float(wall_time_s),
        "seed": cfg.seed,
        "engine": cfg.engine,
        "auc_averaging": ev.auc,
        "fedwear_version": version,
        "versions": library_versions(),
        "config_hash": cfg.hash(),
        "metric_notes": "final/best: sample-weighted mean over clients (weights: test windows); "
        "*_stats add the unweighted mean, population std over clients and the mean of the worst decile",
        "bytes_notes": "bytes_*: training messages (array payloads); eval_bytes_down: each evaluated "
        "client's message plus the global model; eval_bytes_up: 8 bytes per reported metric value",
    }


def library_versions() -> dict[str, str | None]:
    """Versions that bit-for-bit reproducibility depends on (None: not installed)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "numpy", "scipy", "scikit-learn", "pandas", "flwr"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


__all__ = ["aggregate_metrics", "build_summary", "library_versions"]
