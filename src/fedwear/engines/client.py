"""What one client does, identical under every engine: train, and evaluate the views."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from fedwear.config import RunConfig
from fedwear.data.types import ClientData, Windows
from fedwear.evaluation.metrics import classification_metrics, predict
from fedwear.methods.api import Method, Predictor, Record
from fedwear.seeding import derive_seed

Row = dict[str, object]


def fingerprint(*records: Record) -> str:
    """A digest of records' array names, dtypes, shapes, bytes and scalars."""
    h = hashlib.sha1()
    for rec in records:
        for name in sorted(rec.arrays):
            a = rec.arrays[name]
            h.update(f"{name}|{a.dtype}|{a.shape}".encode())
            h.update(a.tobytes())
        h.update(repr(sorted(rec.scalars.items())).encode())
    return h.hexdigest()


class SharedResults:
    """Metrics of identical predictors on the same windows, computed once per evaluation round.

    By the contract a personal predictor is a function of ``(down, state)`` only, so clients
    whose ``(down, state)`` are identical (every client of a global-model method, on the pooled
    test set of the generalization view) get the same result; it is computed once.
    """

    def __init__(self) -> None:
        self._round: int | None = None
        self._store: dict[tuple[str, int], Row] = {}

    def get(self, round: int, key: tuple[str, int], compute: Callable[[], Row]) -> Row:
        if round != self._round:
            self._round, self._store = round, {}
        if key not in self._store:
            self._store[key] = compute()
        return self._store[key]


class ClientRuntime:
    """One client: its data, and (for the generalization view) the pooled test set if available."""

    def __init__(self, method: Method, data: ClientData, cfg: RunConfig, pooled_test: Windows | None = None,
                 shared: SharedResults | None = None):
        self.method = method
        self.data = data
        self.cfg = cfg
        self.pooled_test = pooled_test
        self.shared = shared

    def fit(self, down: Record, state: Record, round: int) -> tuple[Record, Record]:
        seed = derive_seed(self.cfg.seed, "fit", round, self.data.client_id)
        return self.method.fit(down, state, self.data, round, seed)

    def evaluate(self, down: Record, state: Record, global_msg: Record | None, round: int, new: bool) -> list[Row]:
        """Rows ``{view, split, n, accuracy, macro_f1, auc}`` for the views that apply."""
        ev = self.cfg.evaluation
        m = self.method
        rows: list[Row] = []
        splits = ["test"] + (["val"] if ev.best_split == "val" else [])
        if new:
            if "new_clients" in ev.views:
                seed = derive_seed(self.cfg.seed, "adapt", round, self.data.client_id)
                adapted = m.adapt(down, self.data, seed)
                pred = m.personal_predictor(down, adapted)
                if pred is None and global_msg is not None:
                    pred = m.global_predictor(global_msg)
                if pred is not None:
                    rows += self._rows(pred, "new_clients", splits)
            return rows
        pred = None
        if {"personalized", "generalization"} & set(ev.views):
            seed = derive_seed(self.cfg.seed, "personalize", round, self.data.client_id)
            personal = m.personalize(down, state, self.data, seed)
            pred = m.personal_predictor(down, personal)
        if pred is not None:
            if "personalized" in ev.views:
                rows += self._rows(pred, "personalized", splits)
            if "generalization" in ev.views and self.pooled_test is not None:
                pooled = self.pooled_test
                row = lambda: self._row(pred, "generalization", "test", pooled)  # noqa: E731
                if self.shared is None:
                    rows.append(row())
                else:
                    rows.append(self.shared.get(round, (fingerprint(down, personal), id(pooled)), row))
        if "global" in ev.views and global_msg is not None:
            rows += self._rows(m.global_predictor(global_msg), "global", splits)
        return rows

    def _rows(self, pred: Predictor, view: str, splits: list[str]) -> list[Row]:
        return [self._row(pred, view, s, getattr(self.data, s)) for s in splits]

    def _row(self, pred: Predictor, view: str, split: str, w: Windows) -> Row:
        logits = predict(pred, w.x, self.cfg.evaluation.batch_size)
        return {"view": view, "split": split, "n": len(w), **classification_metrics(w.y, logits, self.cfg.evaluation.auc)}
