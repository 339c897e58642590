"""FedReptile (Meta-HAR's baseline, Chain123/Meta-HAR reptile.py; Reptile: Nichol, Achiam and Schulman 2018): the
whole classifier meta-learned federatedly with cross-entropy and Reptile steps, then fine-tuned by
each user with cross-entropy.

Rounds: FedAvg's local training of the whole model (global labels, one head for every user), and
the server's step ``theta + sigma * (mean theta_u - theta)`` (``methods/meta.py``; sigma = 1 and
an unweighted mean, as the code's ``reptile.py``). Evaluation: budgets ``k1``, ``k2``, ``k3`` =
the global model after 1, 2 and 3 cumulative epochs of cross-entropy fine-tuning on the user's
train windows (the code's FedReptile(k)) with the user's own optimiser; the untuned global model
is the ``global`` view (the code's "before", FedAvg's result).
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedwear.data.types import ClientData
from fedwear.methods.api import Options, Personalized, Record
from fedwear.methods.fedavg import PARTS
from fedwear.methods.meta import Reptile
from fedwear.methods.training import LocalOptimizer, model_arrays
from fedwear.seeding import derive_seed


class FedReptileOptions(Options):
    sigma: float = Field(1.0, gt=0, le=1, description="Reptile outer step size (the code's 1.0)")
    weighted: bool = Field(False, description="weight the users' mean by train windows (the code: unweighted)")


class FedReptile(Reptile):
    name = "fedreptile"
    summary = ("FedReptile (Meta-HAR's baseline): the whole classifier trained with Reptile steps, then "
               "fine-tuned by each user with cross-entropy for 1-3 epochs (budgets k1-k3).")
    Options = FedReptileOptions
    budgets = ("k1", "k2", "k3")

    def personalize(self, down: Record, state: Record, data: ClientData, seed: int) -> Personalized:
        """A training user fine-tunes with its own optimiser (``reptile.py``'s ``adapt_train``), whose
        moments it keeps; its learning rate stays where the schedule has brought it."""
        evaluate, opt = self.tune(down, state, data, seed)
        if not self.task.training.optimizer.persist:
            return Personalized(evaluate)
        return Personalized(evaluate, Record({**state.arrays, **opt.state_arrays()}, dict(state.scalars)))

    def adapt(self, down: Record, data: ClientData, seed: int) -> Personalized:
        """A new user: a fresh optimiser at the initial learning rate (the code never steps its
        scheduler; its meta-test accuracy is read from another user's model, a bug not copied)."""
        return Personalized(self.tune(down, Record(), data, seed)[0])

    def tune(self, down: Record, state: Record, data: ClientData, seed: int) -> tuple[dict[str, Record], LocalOptimizer]:
        """The global model after each cumulative epoch of cross-entropy fine-tuning, with the
        optimiser of ``state`` (scheduler not stepped)."""
        torch.manual_seed(seed)  # any dropout in the fine-tuning: the same draws on every engine
        model = self.load(down, Record())
        opt = self.optimizer(model, PARTS, state, scheduled=False)
        out = {}
        for k, budget in enumerate(self.budgets, 1):
            self.train(model, opt, data, derive_seed(seed, "tune", k), epochs=1)
            out[budget] = Record(model_arrays(model, PARTS))
        return out, opt


__all__ = ["FedReptile", "FedReptileOptions"]
