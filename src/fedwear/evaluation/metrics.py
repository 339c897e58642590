"""Classification metrics per client and their aggregation over clients.

AUC: ``macro_ovr`` is sklearn's macro one-vs-rest AUC on softmax probabilities over the
classes present in the client's labels (classes with no positive or no negative are skipped);
``micro_logits`` is ProtoHAR's choice (cheng-haha/ProtoHAR userbase.py): micro AUC of raw logits against the
one-hot labels over all Q classes.

Macro-F1 and AUC are sklearn's definitions (``f1_score(average="macro", zero_division=0)``,
``roc_auc_score``) computed from counts and ranks: sklearn's input validation costs ~9 ms a
call, which is most of an evaluation round with many small clients (200 clients: ~2 s of
~3.5 s). ``tests/test_metrics.py`` checks both against sklearn.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def classification_metrics(y: np.ndarray, logits: np.ndarray, auc: str = "macro_ovr") -> dict[str, float]:
    """accuracy, macro-F1 (sklearn, over labels in y_true U y_pred) and AUC of one client."""
    if len(y) == 0:
        return {"accuracy": float("nan"), "macro_f1": float("nan"), "auc": float("nan")}
    pred = logits.argmax(1)
    out = {
        "accuracy": float((pred == y).mean()),
        "macro_f1": macro_f1(y, pred),
    }
    q = logits.shape[1]
    onehot = np.eye(q, dtype=np.int8)[y]
    if auc == "micro_logits":
        ok = 0 < onehot.sum() < onehot.size
        out["auc"] = binary_auc(onehot.ravel() == 1, logits.ravel()) if ok else float("nan")
    else:
        present = [c for c in range(q) if 0 < onehot[:, c].sum() < len(y)]
        if not present:
            out["auc"] = float("nan")
        else:
            z = logits - logits.max(1, keepdims=True)
            prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
            out["auc"] = float(np.mean([binary_auc(onehot[:, c] == 1, prob[:, c]) for c in present]))
    return out


def macro_f1(y: np.ndarray, pred: np.ndarray) -> float:
    """sklearn's macro F1 (zero_division=0): over the labels in ``y`` or ``pred``, the mean of
    ``2 tp / (true + predicted)`` (sklearn's own formula, so the values are the same bits)."""
    labels, idx = np.unique(np.concatenate([y, pred]), return_inverse=True)
    yi, pi = idx[: len(y)], idx[len(y):]
    true = np.bincount(yi, minlength=len(labels)).astype(np.float64)
    predicted = np.bincount(pi, minlength=len(labels)).astype(np.float64)
    tp = np.bincount(yi[yi == pi], minlength=len(labels)).astype(np.float64)
    return float(np.mean(2.0 * tp / (true + predicted)))


def confusion_counts(y: np.ndarray, pred: np.ndarray, num_classes: int) -> np.ndarray:
    """``[num_classes, num_classes]`` int64 counts: row = true class, column = predicted class
    (sklearn's ``confusion_matrix`` layout over ``labels=range(num_classes)``)."""
    y, pred = np.asarray(y, np.int64), np.asarray(pred, np.int64)
    if len(y) and (max(y.max(), pred.max()) >= num_classes or min(y.min(), pred.min()) < 0):
        raise ValueError(f"class index outside 0..{num_classes - 1}")
    flat = np.bincount(y * num_classes + pred, minlength=num_classes * num_classes)
    return flat[: num_classes * num_classes].reshape(num_classes, num_classes).astype(np.int64)


def per_class_f1(counts: np.ndarray) -> np.ndarray:
    """Each class's F1 from a confusion matrix (rows true, columns predicted): ``2 tp / (true +
    predicted)``, sklearn's formula; NaN for a class neither true nor predicted (sklearn leaves
    such a label out of its macro mean: ``np.nanmean`` of this equals :func:`macro_f1`)."""
    counts = np.asarray(counts, np.float64)
    tp, true, predicted = np.diag(counts), counts.sum(1), counts.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(true + predicted > 0, 2.0 * tp / (true + predicted), np.nan)


def binary_auc(positive: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC of one binary problem as the Mann-Whitney statistic with mid-ranks for ties,
    which is the area sklearn's ``roc_auc_score`` integrates. Needs both classes present."""
    from scipy.stats import rankdata  # imported here: it slows every start-up

    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    ranks = rankdata(score)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def summarize(values: np.ndarray, weights: np.ndarray, lower_is_better: bool = False) -> dict[str, float]:
    """Sample-weighted mean, unweighted mean and std over clients, and the mean of the worst decile
    of clients: the lowest values, or the highest when ``lower_is_better`` (errors, losses)."""
    ok = ~np.isnan(values)
    v, w = values[ok], weights[ok]
    if len(v) == 0:
        nan = float("nan")
        return {"weighted": nan, "mean": nan, "std": nan, "worst10": nan}
    k = max(1, int(np.ceil(0.1 * len(v))))
    return {
        "weighted": float(np.average(v, weights=w)) if w.sum() > 0 else float(v.mean()),
        "mean": float(v.mean()),
        "std": float(v.std()),
        "worst10": float((np.sort(v)[::-1] if lower_is_better else np.sort(v))[:k].mean()),
    }


#: Metrics where lower is better (regression later); every other metric is higher-is-better.
LOWER_IS_BETTER: frozenset[str] = frozenset({"mse", "mae", "mape", "loss"})
#: The values a metric can take: proportions in [0, 1], errors >= 0 (inf: a diverged forecaster).
METRIC_RANGE: dict[str, tuple[float, float]] = {"accuracy": (0.0, 1.0), "macro_f1": (0.0, 1.0), "auc": (0.0, 1.0),
                                                 "mse": (0.0, np.inf), "mae": (0.0, np.inf), "mape": (0.0, np.inf)}
#: Metrics defined on every window set with at least one window (AUC is not: one class only).
DEFINED_WHEN_ANY = ("accuracy", "macro_f1", "mse", "mae", "mape")


def impossible_value(metric: str, value: object, n: object = None, strict: bool = False) -> bool:
    """Whether ``value`` cannot be ``metric`` of a set of ``n`` windows: not a number, or outside
    :data:`METRIC_RANGE`. ``strict`` (to compare runs on it) also refuses what only a diverged or
    broken run reports: inf, and NaN where the metric is defined (``n`` > 0 or unknown). Other
    metrics are never impossible."""
    if metric not in METRIC_RANGE:
        return False
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
    if np.isnan(v):
        if not strict or metric not in DEFINED_WHEN_ANY:
            return False
        try:
            return not float(n) <= 0  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return True
    low, high = METRIC_RANGE[metric]
    return not low <= v <= high or (strict and np.isinf(v))


def first_impossible(frame: pd.DataFrame, strict: bool = False) -> tuple[int, str] | None:
    """The position and column of the first value of a metrics.csv frame that
    :func:`impossible_value` refuses, or None (vectorised)."""
    n = pd.to_numeric(frame["n"], errors="coerce").to_numpy(float) if "n" in frame else np.full(len(frame), np.nan)
    hits = []
    for column in (c for c in frame.columns if c in METRIC_RANGE):
        raw = frame[column]
        values = pd.to_numeric(raw, errors="coerce").to_numpy(float)
        written_nan = (raw.isna() | raw.astype(str).str.strip().str.lower().isin(("nan", ""))).to_numpy()
        low, high = METRIC_RANGE[column]
        with np.errstate(invalid="ignore"):
            bad = (np.isnan(values) & ~written_nan) | (values < low) | (values > high)
            if strict:
                bad |= np.isinf(values)
                if column in DEFINED_WHEN_ANY:
                    bad |= np.isnan(values) & ~(n <= 0)
        if bad.any():
            hits.append((int(np.flatnonzero(bad)[0]), column))
    return min(hits) if hits else None



def client_weights(how: str, n_test: np.ndarray, n_train: np.ndarray | None) -> np.ndarray:
    """Weights of the over-clients mean (``evaluation.client_weights``): test windows (Eq. 12 of
    ProtoHAR's paper), train windows (ProtoHAR's serverbase.py) or uniform."""
    n_test = np.asarray(n_test, float)
    if how == "test":
        return n_test
    if how == "train":
        if n_train is None:
            raise ValueError("client_weights=train needs each row's n_train")
        return np.asarray(n_train, float)
    return np.ones_like(n_test)


def rows_summary(rows: list[dict], metric: str, how: str) -> dict[str, float]:
    """``summarize`` of one metric over evaluation rows (dicts with n, n_train and the metric)."""
    values = np.array([r[metric] for r in rows], float)
    n_train = np.array([r["n_train"] for r in rows]) if rows and "n_train" in rows[0] else None
    return summarize(values, client_weights(how, np.array([r["n"] for r in rows]), n_train),
                     lower_is_better=metric in LOWER_IS_BETTER)


def regression_metrics(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """MSE, MAE and MAPE (in %, ``100 * mean(|y - pred| / |y|)``: sklearn's
    ``mean_absolute_percentage_error`` times 100, as PCFedH's tables print it; validators.py) of one
    client, in the targets' units (bpm for heart rate)."""
    y, pred = np.asarray(y, np.float64), np.asarray(pred, np.float64)
    if len(y) == 0:
        return {"mse": float("nan"), "mae": float("nan"), "mape": float("nan")}
    err = y - pred
    eps = np.finfo(np.float64).eps  # sklearn's guard against y == 0
    return {"mse": float(np.mean(err**2)), "mae": float(np.mean(np.abs(err))),
            "mape": float(100 * np.mean(np.abs(err) / np.maximum(np.abs(y), eps)))}
