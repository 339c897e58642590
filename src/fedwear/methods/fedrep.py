"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021, Algorithm 1).

Each selected client first trains its personal head with the shared representation frozen,
then the representation with its head frozen; the server averages the representations
(``body``, weighted by train windows), heads never leave the clients.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from pydantic import Field
from torch import nn

from fedwear.methods.api import Options
from fedwear.methods.fedavg import FedAvg
from fedwear.seeding import derive_seed


class FedRepOptions(Options):
    head_epochs: int = Field(
        10, ge=0,
        description="epochs of the head step per round (FedRep's scripts: --local_ep 11 --local_rep_ep 1, "
        "i.e. 10 head epochs + 1 body epoch; ProtoHAR's code runs FedRep with 1); the body step runs local_epochs",
    )
    head_lr: float | None = Field(
        None, gt=0, description="learning rate of the head step; null: optimizer.lr (FedRep uses one lr; ProtoHAR's code 0.01)"
    )


@contextmanager
def frozen(module: nn.Module):
    """``module``'s parameters take no gradient inside the block."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class FedRep(FedAvg):
    name = "fedrep"
    devices = ("cpu", "cuda")  # no tensors of its own beyond FedAvg's model and batches
    summary = "FedRep (Collins et al. 2021): per round, the head trains on a frozen body, then the body on a frozen head; bodies are averaged."
    Options = FedRepOptions
    shared = ("body",)
    personal = ("head",)

    def local_update(self, model, state, data, seed):
        """The head on the frozen body, then the body on the frozen head (Algorithm 1)."""
        head_opt = self.optimizer(model, ("head",), state, name="head", lr=self.options.head_lr)
        with frozen(model.body):
            self.train(model, head_opt, data, seed, epochs=self.options.head_epochs, loss_fn=self.head_loss)
        body_opt = self.optimizer(model, ("body",), state, name="body")
        with frozen(model.head):
            loss = self.train(model, body_opt, data, derive_seed(seed, "body"))
        return loss, (head_opt, body_opt)

    def head_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The head step's objective: cross-entropy (ProtoHAR's code adds nothing here either)."""
        return self.criterion(model(x), y)

    def adapt(self, down, data, seed):
        """A new client trains a head on the global representation for the adaptation budget
        (the head step's objective and learning rate)."""
        return self.train_personal(down, data, seed, self.personal, self.head_loss, self.options.head_lr)


__all__ = ["FedRep", "frozen"]
