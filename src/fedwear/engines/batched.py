"""The client-batched engine: the in-process engine, with a round's clients trained together.

``engine: batched`` hands a round's fits to ``Method.fit_many``; FedAvg-family methods whose losses
read only their arguments, on a small model, train them in one vectorised computation
(``fedwear.methods.together``), the others one after another as in ``engine: sim``. Evaluation,
client states and checkpoints are the in-process engine's.
"""

from __future__ import annotations

from collections.abc import Callable

from fedwear.engines.client import TRAINING_BYTES
from fedwear.engines.sim import SimExecutor
from fedwear.methods.api import Record


class BatchedExecutor(SimExecutor):
    def fit(self, round: int, downs: dict[str, Record], on_reply: Callable[[str], None] | None = None,
            on_step: Callable[[str, int, int], None] | None = None) -> dict[str, Record]:
        """``on_step`` is not called: the clients' steps are taken together."""
        ids = list(downs)
        if not ids:
            return {}
        method = self.trainers[ids[0]].method
        jobs = [(downs[c], self.states.get(c, Record()), self.trainers[c].data, self.trainers[c].fit_seed(round))
                for c in ids]
        method.training_bytes = 0
        replies = {}
        for cid, (up, state) in zip(ids, method.fit_many(jobs, round), strict=True):
            replies[cid], self.states[cid] = up, state
        if method.training_bytes:  # the largest over the round's clients (0: the vectorised path)
            replies = {c: Record(up.arrays, {**up.scalars, TRAINING_BYTES: method.training_bytes})
                       for c, up in replies.items()}
        for cid in replies if on_reply else ():  # trained together: all arrive at once
            on_reply(cid)
        return replies
