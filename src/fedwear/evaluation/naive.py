"""Naive forecasts, reported beside every forecasting method: a learned model's gain only
means something against them (PPG-DaLiA: the last value already scores MSE ~4.7 bpm^2 where
PCFedH's paper reports 2.549).

- ``last_value``: the next value is the last one seen (``x[:, -1]``; PCFedH's validator logs it).
- ``client_mean``: the next value is the mean of the client's train targets.
"""

from __future__ import annotations

import numpy as np

from fedwear.data.forecast import chronological_split, next_value_windows
from fedwear.evaluation.metrics import regression_metrics

NAIVE = ("last_value", "client_mean")


def naive_forecasts(x: np.ndarray, train_y: np.ndarray) -> dict[str, np.ndarray]:
    """Both naive forecasts of the windows ``x`` (``[N, L]``, the target series' past values):
    the last value seen, and the mean of the client's train targets ``train_y``."""
    mean = train_y.mean(dtype=np.float64) if len(train_y) else np.nan
    return {"last_value": x[:, -1] if len(x) else np.zeros(0, x.dtype),
            "client_mean": np.full(len(x), mean, np.float64)}


def naive_rows(series: dict[str, np.ndarray], length: int = 150, train_fraction: float = 0.8,
               train_multiple: int = 1, skip_last: bool = False) -> list[dict[str, object]]:
    """One row per (client, forecast) on each client's chronological test windows: ``client``,
    ``forecast``, ``n`` and the regression metrics."""
    rows: list[dict[str, object]] = []
    for client, values in series.items():
        x, y = next_value_windows(values, length, skip_last)
        split = chronological_split(len(y), train_fraction, train_multiple)
        xt, yt = x[split.test], y[split.test]
        forecasts = naive_forecasts(xt, y[split.train])
        for name in NAIVE:
            rows.append({"client": client, "forecast": name, "n": len(yt), **regression_metrics(yt, forecasts[name])})
    return rows


def over_clients(values: np.ndarray, ddof: int = 0) -> tuple[float, float]:
    """Unweighted mean and std over clients (PCFedH's "a±b", pcfedh/pcfedh validators.py); ``ddof=0``: the
    population std, ``ddof=1``: the sample std."""
    v = np.asarray(values, np.float64)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=ddof)) if len(v) > ddof else float("nan")
