"""The in-process engine: clients one after another, data already in RAM, states in a
:class:`~fedwear.engines.store.ClientStore` (memory, or files in the run directory)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from fedwear.config import RunConfig
from fedwear.data.types import ClientData, Windows
from fedwear.engines.client import ClientRuntime, EvalCache, Row
from fedwear.engines.store import ClientStore, open_store
from fedwear.methods.api import Method, Record
from fedwear.methods.training import STEP_HOOK


class SimExecutor:
    """Runs client work in this process.

    ``out`` is the run directory, needed with ``client_states: disk`` (the states' files live
    there); it is keyword-only with a default so older callers keep working, and a subclass
    (``engine: batched``) passes it on to ``super().__init__``. ``self.states`` is the one place
    client states live: read them with ``.get(cid, Record())``, write with ``states[cid] = ...``.
    """

    def __init__(self, method: Method, train: list[ClientData], evaluated: list[ClientData],
                 new: list[ClientData], pooled_test: Windows, cfg: RunConfig,
                 test_slices: dict[str, slice] | None = None, *, out: Path | None = None) -> None:
        self.trainers = {c.client_id: ClientRuntime(method, c, cfg) for c in train}
        shared = EvalCache()
        slices = test_slices or {}
        self.evaluated = {c.client_id: ClientRuntime(method, c, cfg, pooled_test, shared, slices.get(c.client_id))
                          for c in evaluated}
        self.new = {c.client_id: ClientRuntime(method, c, cfg) for c in new}
        self.states: ClientStore = open_store(cfg.client_states, out)

    def fit(self, round: int, downs: dict[str, Record], on_reply: Callable[[str], None] | None = None,
            on_step: Callable[[str, int, int], None] | None = None) -> dict[str, Record]:
        replies = {}
        for cid, down in downs.items():
            hook = STEP_HOOK.set(functools.partial(on_step, cid) if on_step else None)
            try:
                up, self.states[cid] = self.trainers[cid].fit(down, self.states.get(cid, Record()), round)
            finally:
                STEP_HOOK.reset(hook)
            replies[cid] = up
            if on_reply:
                on_reply(cid)
        return replies

    def evaluate(self, round: int, downs: dict[str, Record], global_msg: Record | None) -> dict[str, list[Row]]:
        out = {}
        for cid, down in downs.items():
            if cid in self.new:
                out[cid], _ = self.new[cid].evaluate(down, Record(), global_msg, round, new=True)
            else:
                out[cid], keep = self.evaluated[cid].evaluate(down, self.states.get(cid, Record()), global_msg,
                                                              round, new=False)
                if keep is not None:
                    self.states[cid] = keep
        return out

    def client_states(self) -> dict:
        return self.states.checkpoint()

    def checkpoint_saved(self) -> None:
        self.states.checkpoint_saved()

    def restore(self, states: dict) -> None:
        self.states.restore(states)

    def close(self) -> None:
        self.states.close()
