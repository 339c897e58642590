"""The in-process engine: clients one after another, states in memory, data already in RAM."""

from __future__ import annotations

from fedwear.config import RunConfig
from fedwear.data.types import ClientData, Windows
from fedwear.engines.client import ClientRuntime, EvalCache, Row
from fedwear.methods.api import Method, Record


class SimExecutor:
    def __init__(self, method: Method, train: list[ClientData], evaluated: list[ClientData],
                 new: list[ClientData], pooled_test: Windows, cfg: RunConfig,
                 test_slices: dict[str, slice] | None = None) -> None:
        self.trainers = {c.client_id: ClientRuntime(method, c, cfg) for c in train}
        shared = EvalCache()
        slices = test_slices or {}
        self.evaluated = {c.client_id: ClientRuntime(method, c, cfg, pooled_test, shared, slices.get(c.client_id))
                          for c in evaluated}
        self.new = {c.client_id: ClientRuntime(method, c, cfg) for c in new}
        self.states: dict[str, Record] = {}

    def fit(self, round: int, downs: dict[str, Record]) -> dict[str, Record]:
        replies = {}
        for cid, down in downs.items():
            up, self.states[cid] = self.trainers[cid].fit(down, self.states.get(cid, Record()), round)
            replies[cid] = up
        return replies

    def evaluate(self, round: int, downs: dict[str, Record], global_msg: Record | None) -> dict[str, list[Row]]:
        out = {}
        for cid, down in downs.items():
            if cid in self.new:
                out[cid] = self.new[cid].evaluate(down, Record(), global_msg, round, new=True)
            else:
                out[cid] = self.evaluated[cid].evaluate(down, self.states.get(cid, Record()), global_msg, round, new=False)
        return out

    def client_states(self) -> dict[str, Record]:
        return self.states

    def restore(self, states: dict[str, Record]) -> None:
        self.states = dict(states)

    def close(self) -> None:
        pass
