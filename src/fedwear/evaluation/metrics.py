"""Classification metrics per client and their aggregation over clients.

AUC: ``macro_ovr`` is sklearn's macro one-vs-rest AUC on softmax probabilities over the
classes present in the client's labels (classes with no positive or no negative are skipped);
``micro_logits`` is ProtoHAR's choice (SPECS A5): micro AUC of raw logits against the
one-hot labels over all Q classes.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import f1_score, roc_auc_score

from fedwear.evaluation.predictor import Fn


@torch.no_grad()
def predict(predictor: Fn, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
    """Logits of ``predictor`` on ``x`` (``[N, T, C]``), in batches."""
    xt = torch.from_numpy(np.ascontiguousarray(x))
    outs = [predictor(xt[i : i + batch_size]) for i in range(0, len(xt), batch_size)]
    return torch.cat(outs).float().numpy() if outs else np.zeros((0, 0), np.float32)


def classification_metrics(y: np.ndarray, logits: np.ndarray, auc: str = "macro_ovr") -> dict[str, float]:
    """accuracy, macro-F1 (sklearn, over labels in y_true U y_pred) and AUC of one client."""
    if len(y) == 0:
        return {"accuracy": float("nan"), "macro_f1": float("nan"), "auc": float("nan")}
    pred = logits.argmax(1)
    out = {
        "accuracy": float((pred == y).mean()),
        "macro_f1": float(f1_score(y, pred, average="macro", zero_division=0)),
    }
    q = logits.shape[1]
    onehot = np.eye(q, dtype=np.int8)[y]
    if auc == "micro_logits":
        ok = 0 < onehot.sum() < onehot.size
        out["auc"] = float(roc_auc_score(onehot, logits, average="micro")) if ok else float("nan")
    else:
        present = [c for c in range(q) if 0 < onehot[:, c].sum() < len(y)]
        if not present:
            out["auc"] = float("nan")
        else:
            z = logits - logits.max(1, keepdims=True)
            prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
            out["auc"] = float(roc_auc_score(onehot[:, present], prob[:, present], average="macro"))
    return out


def summarize(values: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """Sample-weighted mean, unweighted mean and std over clients, mean of the worst decile."""
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
        "worst10": float(np.sort(v)[:k].mean()),
    }


#: Metrics where lower is better (regression later); every other metric is higher-is-better.
LOWER_IS_BETTER: frozenset[str] = frozenset({"mse", "mae", "mape", "loss"})


def client_weights(how: str, n_test: np.ndarray, n_train: np.ndarray | None) -> np.ndarray:
    """Weights of the over-clients mean (``evaluation.client_weights``): test windows (Eq. 12 of
    ProtoHAR's paper), train windows (ProtoHAR's code, SPECS A5) or uniform."""
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
    return summarize(values, client_weights(how, np.array([r["n"] for r in rows]), n_train))
