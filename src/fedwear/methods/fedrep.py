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

from fedwear.methods import batched
from fedwear.methods.api import FitJob, Options
from fedwear.methods.fedavg import FedAvg
from fedwear.methods.training import host
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

    # ---- clients trained together (engine: batched) -----------------------------------------
    trains_together = True

    def fit_together(self, jobs):
        """``fit`` of every job at once (``train_head_then_body``); equal to ``fit`` up to float
        rounding (tests/test_batched.py)."""
        out = []
        for (_, state, data, _), head, body in zip(jobs, *self.train_head_then_body(jobs), strict=True):
            arrays = {n: host(w).copy() for n, w in body.weights.items()}
            up = self.reply_together(arrays, data, body.loss)
            out.append((up, self.kept_together(state, arrays, {"head": head.momentum, "body": body.momentum})))
        return out

    def train_head_then_body(self, jobs: list[FitJob], **body_step
                             ) -> tuple[list[batched.ClientResult], list[batched.ClientResult]]:
        """``local_update`` of every job at once: the heads on the frozen bodies, then the bodies
        on the frozen heads (``body_step``: more arguments of the body step's ``train_together``)."""
        head, body = self.parameter_names(("head",)), self.parameter_names(("body",))
        work = [self.client_job(down, state, data, seed, "head", head) for down, state, data, seed in jobs]
        heads = self.train_together(work, trained=head, lr=self.options.head_lr or self.task.training.optimizer.lr,
                                    epochs=self.options.head_epochs)
        for job, res, (_, state, _, seed) in zip(work, heads, jobs, strict=True):
            job.weights, job.seed = res.weights, derive_seed(seed, "body")
            job.momentum = self.kept_momentum(state, "body", body)
        return heads, self.train_together(work, trained=body, **body_step)

    def head_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The head step's objective: cross-entropy (ProtoHAR's code adds nothing here either)."""
        return self.criterion(model(x), y)

    def adapt(self, down, data, seed):
        """A new client trains a head on the global representation for the adaptation budget
        (the head step's objective and learning rate)."""
        return self.train_personal(down, data, seed, self.personal, self.head_loss, self.options.head_lr)


__all__ = ["FedRep", "frozen"]
