"""FedPer (Arivazhagan et al., arXiv:1912.00818, 2019): shared base layers, personal head.

Clients train the whole model; only the base (``body``) is sent and averaged, the
personalization layers (``head``) stay on each client. A declaration on FedAvg.
"""

from __future__ import annotations

from fedwear.methods.fedavg import FedAvg


class FedPer(FedAvg):
    name = "fedper"
    summary = "FedPer (Arivazhagan et al. 2019): the body is averaged, each client keeps its own head."
    shared = ("body",)
    personal = ("head",)

    def adapt(self, down, data, seed):
        """A new client trains a head on the global body (the body is not in the optimiser)."""
        return self.train_personal(down, data, seed, self.personal)


__all__ = ["FedPer"]
