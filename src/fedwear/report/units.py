"""How a metric is shown: classification metrics in %, the regression metrics in the units of
heart rate (fedwear's regression task forecasts HR and metrics.csv holds its errors in bpm),
any other metric in the unit of metrics.csv."""

from __future__ import annotations

import math
from collections.abc import Iterable

from fedwear.config import METRICS

NAMES = {"accuracy": "accuracy", "macro_f1": "macro-F1", "auc": "AUC",
         "mse": "MSE", "mae": "MAE", "mape": "MAPE"}
#: Units of the regression metrics as metrics.csv holds them: errors of the forecast heart rate
#: (model outputs mapped back to bpm with ``FederatedData.target``); mape is already in %.
UNITS = {"mse": "bpm²", "mae": "bpm", "mape": "%"}


def scale(metric: str) -> float:
    """Factor applied before display: 100 for the classification metrics (shown in %), else 1."""
    return 100.0 if metric in METRICS else 1.0


def unit(metric: str) -> str | None:
    """The unit ``metric`` is shown in (None: the unit of metrics.csv, unknown here)."""
    return "%" if metric in METRICS else UNITS.get(metric)


def axis_label(metric: str) -> str:
    """Axis label of ``metric``, with its unit."""
    name, u = NAMES.get(metric, metric), unit(metric)
    return f"{name} ({u})" if u else name


def row_label(metric: str) -> str:
    """Name of ``metric`` in a table row: the regression metrics with their unit, the
    classification metrics without (the caption says they are in %)."""
    return axis_label(metric) if metric in UNITS else NAMES.get(metric, metric)


def fmt(metric: str, value: float | None) -> str:
    """``value`` of ``metric`` for a table cell: 2 decimals in % or 4 significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    v = scale(metric) * float(value)
    return f"{v:.2f}" if metric in METRICS else f"{v:.4g}"


UNITS_NOTE = ("accuracy, macro-F1 and AUC in %; any other metric (e.g. mse, mae, mape) "
              "in the unit of metrics.csv")
REGRESSION_NOTE = ("MSE in bpm², MAE in bpm (errors of the forecast heart rate, in the target's "
                   "units) and MAPE in %")


def units_note(metrics: Iterable[str]) -> str:
    """The units of a table's numbers: :data:`UNITS_NOTE` unless regression metrics are shown."""
    shown = set(metrics)
    if not shown & set(UNITS):
        return UNITS_NOTE
    parts = ["accuracy, macro-F1 and AUC in %"] if shown & set(METRICS) else []
    parts.append(REGRESSION_NOTE)
    if shown - set(METRICS) - set(UNITS):
        parts.append("any other metric in the unit of metrics.csv")
    return "; ".join(parts)
