"""A run folder's files as the results writers read them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedwear.config import RunConfig, load_config


def matching_metrics(cfg: RunConfig, where: Path) -> pd.DataFrame | None:
    """``where``'s ``metrics.csv`` when the folder holds a run of ``cfg`` (same config hash) with at
    least one evaluated round; None when it was not run yet or is a run of another config."""
    if not (where / "metrics.csv").exists() or not (where / "config.yaml").exists():
        return None
    if load_config(where / "config.yaml").hash() != cfg.hash():
        return None
    metrics = pd.read_csv(where / "metrics.csv")
    return None if metrics.empty else metrics


def timing(where: Path) -> pd.DataFrame:
    """``timing.csv`` (one row per round), empty when the run has none."""
    path = where / "timing.csv"
    return pd.read_csv(path) if path.exists() else pd.DataFrame()


def total_cpu_s(where: Path) -> float:
    """The run's CPU seconds over all rounds (NaN for runs begun before timing.csv had cpu_s)."""
    t = timing(where)
    return float(t["cpu_s"].sum()) if len(t) and "cpu_s" in t else float("nan")
