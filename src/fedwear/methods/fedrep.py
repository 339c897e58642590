"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021, Algorithm 1).

Each selected client first trains its personal head with the shared representation frozen,
then the representation with its head frozen; the server averages the representations
(``body``, weighted by train windows), heads never leave the clients.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from fedwear.methods.api import Options
from fedwear.methods.fedavg import FedAvg
from fedwear.methods.fit import Fit, Stage


class FedRepOptions(Options):
    head_epochs: int = Field(
        10, ge=0,
        description="epochs of the head step per round (FedRep's scripts: --local_ep 11 --local_rep_ep 1, "
        "i.e. 10 head epochs + 1 body epoch; ProtoHAR's code runs FedRep with 1); the body step runs local_epochs",
    )
    head_lr: float | None = Field(
        None, gt=0, description="learning rate of the head step; null: optimizer.lr (FedRep uses one lr; ProtoHAR's code 0.01)"
    )


class FedRep(FedAvg):
    name = "fedrep"
    summary = "FedRep (Collins et al. 2021): per round, the head trains on a frozen body, then the body on a frozen head; bodies are averaged."
    Options = FedRepOptions
    shared = ("body",)
    personal = ("head",)

    def stages(self, fit):
        """The head on the frozen body, then the body on the frozen head (Algorithm 1)."""
        return [Stage("head", ("head",), self.head_loss, self.options.head_epochs, lr=self.options.head_lr),
                Stage("body", ("body",), self.loss, self.local_epochs, seed="body")]

    def head_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, fit: Fit | None) -> torch.Tensor:
        """The head step's objective: cross-entropy (ProtoHAR's code adds nothing here either)."""
        return self.criterion(model(x), y)

    def adapt(self, down, data, seed):
        """A new client trains a head on the global representation for the adaptation budget
        (the head step's objective and learning rate)."""
        return self.train_personal(down, data, seed, self.personal, self.head_loss, self.options.head_lr)


__all__ = ["FedRep"]
