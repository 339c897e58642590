"""Centralized: one model trained on the pooled training data of all clients (the upper bound).

Expressed through the contract, not an engine special case: ``training_clients`` pools the
clients into one, which then trains every round like a FedAvg client.
"""

from __future__ import annotations

import numpy as np

from fedwear.data.types import ClientData, Windows
from fedwear.methods.fedavg import FedAvg

POOLED = "pooled"


class Centralized(FedAvg):
    name = "centralized"
    summary = "Centralized: one model on the pooled data of all training clients (upper bound, no privacy)."
    mean_aggregation = False
    no_dp_reason = "it trains one model on the pooled data: there is no client to protect from a server"

    def training_clients(self, data):
        splits = [c.train for c in data.clients]
        pooled = Windows(
            np.concatenate([w.x for w in splits]),
            np.concatenate([w.y for w in splits]),
            np.concatenate([w.recording for w in splits]),
            np.concatenate([w.start for w in splits]),
        )
        empty = pooled.take(np.zeros(0, np.int64))
        return [ClientData(POOLED, pooled, empty, empty)]

    def select(self, server, round, scheduled, all_clients):
        return [POOLED]
