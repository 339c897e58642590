"""LG-FedAvg (Liang et al., "Think Locally, Act Globally", arXiv:2001.01523, 2020, Alg. 1).

The opposite split of FedPer: each client keeps local representation layers (``body``) and
the server averages the global layers (``head``). A declaration on FedAvg. Training starts from
the initial model, as in ProtoHAR's table; the authors' code (github.com/pliang279/LG-FedAvg,
``main_lg.py --load_fed``) starts from a FedAvg-trained model instead.
"""

from __future__ import annotations

from fedwear.methods.fedavg import FedAvg


class LGFedAvg(FedAvg):
    name = "lgfedavg"
    summary = "LG-FedAvg (Liang et al. 2020): local representation layers, a global averaged head."
    shared = ("head",)
    personal = ("body",)

    def adapt(self, down, data, seed):
        """A new client learns its local body under the global head for the adaptation budget."""
        return self.train_personal(down, data, seed, self.personal)


__all__ = ["LGFedAvg"]
