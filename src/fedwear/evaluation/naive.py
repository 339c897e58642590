"""Naive forecasts, reported beside every forecasting method: a learned model's gain only
means something against them (PPG-DaLiA: the last value already scores MSE ~4.7 bpm^2 where
PCFedH's paper reports 2.549).

- ``last_value``: the next value is the last one seen (``x[:, -1]``; PCFedH's validator logs it).
- ``client_mean``: the next value is the mean of the client's train targets.
"""

from __future__ import annotations

import numpy as np

NAIVE = ("last_value", "client_mean")


def naive_forecasts(x: np.ndarray, train_y: np.ndarray) -> dict[str, np.ndarray]:
    """Both naive forecasts of the windows ``x`` (``[N, L]``, the target series' past values):
    the last value seen, and the mean of the client's train targets ``train_y``."""
    mean = train_y.mean(dtype=np.float64) if len(train_y) else np.nan
    return {"last_value": x[:, -1] if len(x) else np.zeros(0, x.dtype),
            "client_mean": np.full(len(x), mean, np.float64)}


def over_clients(values: np.ndarray, ddof: int = 0) -> tuple[float, float]:
    """Unweighted mean and std over clients (PCFedH's "a±b", pcfedh/pcfedh validators.py); ``ddof=0``: the
    population std, ``ddof=1``: the sample std."""
    v = np.asarray(values, np.float64)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=ddof)) if len(v) > ddof else float("nan")
