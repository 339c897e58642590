"""How a metric is shown: classification metrics in %, any other metric in its own unit."""

from __future__ import annotations

import math

from fedwear.config import METRICS

NAMES = {"accuracy": "accuracy", "macro_f1": "macro-F1", "auc": "AUC"}


def scale(metric: str) -> float:
    """Factor applied before display: 100 for the classification metrics (shown in %), else 1."""
    return 100.0 if metric in METRICS else 1.0


def axis_label(metric: str) -> str:
    """Axis label of ``metric``, with its unit."""
    name = NAMES.get(metric, metric)
    return f"{name} (%)" if metric in METRICS else name


def fmt(metric: str, value: float | None) -> str:
    """``value`` of ``metric`` for a table cell: 2 decimals in % or 4 significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    v = scale(metric) * float(value)
    return f"{v:.2f}" if metric in METRICS else f"{v:.4g}"


def fmt_pm(metric: str, mean: float | None, std: float | None) -> str:
    """``mean ± std`` of ``metric`` (both scaled like :func:`fmt`)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    return f"{fmt(metric, mean)} ± {fmt(metric, std)}"


UNITS_NOTE = ("accuracy, macro-F1 and AUC in %; any other metric (e.g. mse, mae, mape) "
              "in the unit of metrics.csv")
