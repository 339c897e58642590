"""The per-client metrics equal sklearn's on the same inputs (ties, missing classes, few windows)."""

import numpy as np
import pytest
from sklearn.metrics import f1_score, roc_auc_score

from fedwear.evaluation.metrics import classification_metrics


def _sklearn(y: np.ndarray, logits: np.ndarray, auc: str) -> dict[str, float]:
    q = logits.shape[1]
    onehot = np.eye(q, dtype=np.int8)[y]
    out = {"accuracy": float((logits.argmax(1) == y).mean()),
           "macro_f1": f1_score(y, logits.argmax(1), average="macro", zero_division=0)}
    if auc == "micro_logits":
        out["auc"] = roc_auc_score(onehot, logits, average="micro")
    else:
        present = [c for c in range(q) if 0 < onehot[:, c].sum() < len(y)]
        z = logits - logits.max(1, keepdims=True)
        prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
        out["auc"] = roc_auc_score(onehot[:, present], prob[:, present], average="macro")
    return out


@pytest.mark.parametrize("auc", ["macro_ovr", "micro_logits"])
@pytest.mark.parametrize("case", range(40))
def test_metrics_equal_sklearn(case: int, auc: str) -> None:
    rng = np.random.default_rng(case)
    q, n = int(rng.integers(2, 13)), int(rng.integers(3, 300))
    y = rng.choice(rng.choice(q, size=int(rng.integers(2, q + 1)), replace=False), size=n)
    if len(np.unique(y)) < 2:
        y[0], y[1] = 0, 1
    logits = rng.normal(size=(n, q)).astype(np.float32)
    if case % 2:  # ties: coarse logits
        logits = np.round(logits, 1)
    ours, ref = classification_metrics(y, logits, auc), _sklearn(y, logits, auc)
    assert ours["accuracy"] == ref["accuracy"]
    assert ours["macro_f1"] == ref["macro_f1"]  # the same formula: the same bits
    assert ours["auc"] == pytest.approx(ref["auc"], abs=1e-12)


def test_worst_decile_is_the_lowest_score_or_the_highest_error() -> None:
    from fedwear.evaluation.metrics import rows_summary

    values = np.arange(1.0, 21.0)  # 20 clients: the worst decile is two of them
    rows = [{"n": 1, "accuracy": v, "mse": v} for v in values]
    assert rows_summary(rows, "accuracy", "uniform")["worst10"] == 1.5
    assert rows_summary(rows, "mse", "uniform")["worst10"] == 19.5
