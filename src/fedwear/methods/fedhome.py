"""FedHome (Q. Wu, X. Chen, Z. Zhou, J. Zhang, "FedHome: Cloud-Edge Based Personalized Federated
Learning for In-Home Health Monitoring", IEEE Transactions on Mobile Computing, 2020), as run in
ProtoHAR's code (github.com/cheng-haha/ProtoHAR, ``serverFedHome.py`` / ``userhome.py``), where
ProtoHAR's (Cheng et al., IEEE JBHI 2023) FedHome numbers come from.

1. Rounds 1 .. R - F: FedAvg on the whole model (the paper's federated training of a global model).
2. Rounds R - F + 1 .. R (F = ``personal_rounds``): every client trains every round and the
   server state no longer changes. A client takes the final global body, frozen, computes the
   representations ``body(x)`` of its train split, drops the classes with at most
   ``min_class_samples`` samples, balances the rest by oversampling and trains only its own
   head on them for ``local_epochs`` epochs per round (the configured optimiser at ``head_lr``:
   SGD with momentum in ProtoHAR's protocol; in order, as the code's DataLoader has no shuffle;
   no clipping).

The paper oversamples with a generative convolutional autoencoder; the code, and so this file,
uses imbalanced-learn's ``SMOTE()`` with its defaults (k_neighbors = 5) instead. The code builds
the balanced set once; here it is rebuilt every personalised round from the same (frozen) body
with the same seed, which gives the same set. Representations are taken in eval mode.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedwear.data.types import ClientData
from fedwear.methods.api import Method, Options, Plan, Record, Task
from fedwear.methods.fedavg import FedAvg, tensors
from fedwear.methods.fit import Fit
from fedwear.methods.training import host, model_arrays
from fedwear.seeding import derive_seed

log = logging.getLogger(__name__)

HEAD = ("head",)


class FedHomeOptions(Options):
    personal_rounds: int = Field(
        50, ge=0,
        description="F: the last F rounds train personal heads (ProtoHAR's runexp.sh: --fine_epochs 50)",
    )
    head_lr: float = Field(
        0.01, gt=0,
        description="learning rate of the personal heads (ProtoHAR's runexp.sh: --personal_learning_rate 0.01)",
    )
    min_class_samples: int = Field(
        5, ge=5,
        description="classes with at most this many train samples are dropped before SMOTE (userhome.py: 5 = SMOTE's k_neighbors)",
    )


class FedHome(FedAvg):
    name = "fedhome"
    same_model_for_all = False  # its own configure: not FedAvg's one global model for every client
    summary = "FedHome (Wu et al. 2020): FedAvg, then each client trains its own head on SMOTE-balanced representations."
    kinds = ("classification",)  # class prototypes / class balancing
    Options = FedHomeOptions
    #: Phase 2 is not a mean of client arrays (central DP / SecAgg+ do not apply).
    mean_aggregation = False

    def __init__(self, task: Task, options: FedHomeOptions) -> None:
        super().__init__(task, options)
        self.first_personal = task.training.rounds - options.personal_rounds + 1
        if self.first_personal <= 1:
            log.warning("fedhome: personal_rounds (%d) >= rounds (%d): no FedAvg phase, heads train on "
                        "the initial body", options.personal_rounds, task.training.rounds)

    def personal_round(self, round: int) -> bool:
        return round >= self.first_personal

    # ---- server -------------------------------------------------------------------------
    def select(self, server, round, scheduled, all_clients):
        return list(all_clients) if self.personal_round(round) else scheduled

    def configure(self, server: Record, client: str, round: int) -> Record:
        """The global model; in phase 2 marked so that a reply without arrays is valid."""
        return Record(server.arrays, {"personal": True} if self.personal_round(round) else {})

    def reply_spec(self, down: Record) -> dict[str, tuple[int, ...] | None]:
        return {} if down.scalars.get("personal") else super().reply_spec(down)

    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        return server if self.personal_round(round) else super().aggregate(server, replies, round)

    # ---- client -------------------------------------------------------------------------
    def fit(self, down, state, data, round, seed):
        if not self.personal_round(round):
            return super().fit(down, state, data, round, seed)
        torch.manual_seed(seed)
        model = self.load(down, state)  # the final global body, the client's head (global at first)
        r, y = self.balanced_representations(model, data)
        opt = self.optimizer(model, HEAD, state, name="head", lr=self.options.head_lr)
        fit = Fit(down, state, data, seed, round, model=model)
        # in order and unclipped, as userhome.py's train_pred
        fit.loss = self.train(model, opt, data, seed, loss_fn=self.head_loss, x=r, y=y, shuffle=False, clip=False)
        fit.optimizer_state.update(opt.state_arrays())
        kept = self.client_state(fit)  # the optimiser's state
        kept.arrays.update(model_arrays(model, HEAD))
        return Record({}, {"num_examples": len(data.train), "loss": fit.loss}), kept

    #: Phase 1 is FedAvg's step, which ``fit_many`` trains together (``engine: batched``);
    #: phase 2's heads train client by client.
    trains_together = True

    def fit_many(self, jobs, round):
        if self.personal_round(round):
            return Method.fit_many(self, jobs, round)
        return super().fit_many(jobs, round)

    def head_loss(self, model: nn.Module, r: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model.head(r), y)

    def balanced_representations(self, model: nn.Module, data: ClientData) -> tuple[torch.Tensor, torch.Tensor]:
        """userhome.py's ``generate_data``: body outputs of the train split, classes with at most
        ``min_class_samples`` samples dropped, the rest grouped by class in order of first
        appearance and balanced by SMOTE (original samples first, then the synthetic ones)."""
        from imblearn.over_sampling import SMOTE  # imported here: it slows every start-up

        x, y = tensors(data)
        with torch.no_grad():
            r = host(model.eval().features(x.to(self.device)))
        labels = y.numpy()
        classes, first, counts = np.unique(labels, return_index=True, return_counts=True)
        order = np.argsort(first)  # the code's Counter order: first appearance
        kept = [c for c, n in zip(classes[order], counts[order], strict=True) if n > self.options.min_class_samples]
        idx = np.concatenate([np.flatnonzero(labels == c) for c in kept] or [np.zeros(0, np.int64)])
        r, labels = r[idx], labels[idx]
        if len(kept) > 1:
            seed = derive_seed(self.task.training.seed, "fedhome-smote", 0, data.client_id)  # one per client
            r, labels = SMOTE(random_state=seed % 2**32).fit_resample(r, labels)
        return torch.from_numpy(np.ascontiguousarray(r, np.float32)), torch.from_numpy(labels.astype(np.int64))


__all__ = ["FedHome"]
