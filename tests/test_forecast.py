"""Forecasting windows, the chronological split, regression metrics and the naive forecasts."""

from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import mean_absolute_error, mean_absolute_percentage_error, mean_squared_error

from fedwear.data.forecast import chronological_split, next_value_windows
from fedwear.data.heart_rate import read_ppg_dalia
from fedwear.evaluation.metrics import regression_metrics
from fedwear.evaluation.naive import NAIVE, naive_forecasts, over_clients
from tests.test_heart_rate import hr_folder


def test_windows_hold_only_past_values() -> None:
    v = np.arange(10, dtype=np.float32)
    x, y = next_value_windows(v, length=3)
    assert x.tolist()[0] == [0, 1, 2] and y.tolist() == [3, 4, 5, 6, 7, 8, 9]
    assert len(x) == len(v) - 3
    # every input value comes strictly before its target (values are their own time index)
    assert (x.max(axis=1) < y).all() and (x[:, -1] == y - 1).all()
    xs, ys = next_value_windows(v, length=3, skip_last=True)
    assert len(xs) == len(x) - 1 and ys[-1] == 8
    assert next_value_windows(v[:3], length=3)[0].shape == (0, 3)


def test_chronological_split() -> None:
    s = chronological_split(57, 0.8)
    assert (s.train, s.test) == (slice(0, 45), slice(45, 57))
    s = chronological_split(57, 0.8, train_multiple=10)  # PCFedH's code: train cut to 40, test from 45
    assert (s.train, s.test) == (slice(0, 40), slice(45, 57))


def test_regression_metrics_by_hand_and_against_sklearn() -> None:
    y, p = np.array([100.0, 50.0, 80.0]), np.array([98.0, 53.0, 80.0])
    m = regression_metrics(y, p)
    assert m["mse"] == pytest.approx((4 + 9 + 0) / 3)
    assert m["mae"] == pytest.approx((2 + 3 + 0) / 3)
    assert m["mape"] == pytest.approx(100 * (0.02 + 0.06 + 0) / 3)
    rng = np.random.default_rng(0)
    y, p = rng.normal(80, 10, 200), rng.normal(80, 10, 200)
    m = regression_metrics(y, p)
    assert m["mse"] == pytest.approx(mean_squared_error(y, p), rel=1e-12)
    assert m["mae"] == pytest.approx(mean_absolute_error(y, p), rel=1e-12)
    assert m["mape"] == pytest.approx(100 * mean_absolute_percentage_error(y, p), rel=1e-12)


def naive_rows(series: dict[str, np.ndarray], length: int = 150, train_fraction: float = 0.8) -> list[dict]:
    """Both naive forecasts of each client's chronological test windows, as the engine scores them."""
    rows = []
    for client, values in series.items():
        x, y = next_value_windows(values, length)
        split = chronological_split(len(y), train_fraction)
        test_y, forecasts = y[split.test], naive_forecasts(x[split.test], y[split.train])
        for name in NAIVE:
            rows.append({"client": client, "forecast": name, "n": len(test_y),
                         **regression_metrics(test_y, forecasts[name])})
    return rows


def test_naive_forecasts_by_hand() -> None:
    rows = naive_rows({"a": np.array([1, 2, 3, 4, 5, 6, 8], np.float32)}, length=2, train_fraction=0.6)
    # windows: targets 3,4,5,6,8 -> train 3 (3,4,5), test 2 (6,8); last values 5,6
    last = next(r for r in rows if r["forecast"] == "last_value")
    mean = next(r for r in rows if r["forecast"] == "client_mean")
    assert last["n"] == 2 and last["mse"] == pytest.approx((1 + 4) / 2)
    assert mean["mse"] == pytest.approx(((6 - 4) ** 2 + (8 - 4) ** 2) / 2)


def test_over_clients_population_or_sample_std() -> None:
    assert over_clients(np.array([1.0, 3.0])) == (2.0, 1.0)
    assert over_clients(np.array([1.0, 3.0, np.nan]), ddof=1) == pytest.approx((2.0, np.sqrt(2)))


def test_last_value_on_ppg_dalia(data_root: Path) -> None:
    """The naive baseline the issue measured: last value, MSE ~4.75 bpm^2 over the 15 clients."""
    series = {s.subject: s.values for s in read_ppg_dalia(hr_folder(data_root, "ppg_dalia_hr"))}
    rows = [r for r in naive_rows(series) if r["forecast"] == "last_value"]
    assert len(rows) == 15
    mse, _ = over_clients(np.array([r["mse"] for r in rows]))
    assert mse == pytest.approx(4.748, abs=0.01)
