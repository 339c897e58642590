"""Local / SOLO: every client trains its own model alone; nothing is communicated.

As in ProtoHAR's ``serverlocal.py`` (cheng-haha/ProtoHAR): all clients train ``local_epochs`` every
round, so ``rounds x local_epochs`` epochs in total.
"""

from __future__ import annotations

from fedwear.methods.fedavg import FedAvg


class Local(FedAvg):
    name = "local"
    summary = "Local (SOLO): each client trains its own model on its own data, no communication."
    shared = ()
    personal = ("body", "head")
    mean_aggregation = False
    no_dp_reason = "its clients send nothing"

    def select(self, server, round, scheduled, all_clients):
        return list(all_clients)

    def aggregate(self, server, replies, round, plan=None):
        return server

    def global_message(self, server):
        return None

    def adapt(self, down, data, seed):
        """A new client trains its own model from the initial weights for the adaptation budget."""
        return self.train_personal(down, data, seed, self.personal)
