"""ProtoHAR (Cheng et al., "ProtoHAR: Prototype Guided Personalized Federated Learning for Human
Activity Recognition", IEEE JBHI 2023, Algorithm 1).

FedRep's two steps with a prototype regulariser in the body step. Per selected client i:

1. head step: h_i trains E_h epochs on the frozen representation phi (cross-entropy);
2. body step: phi trains E_phi (= ``local_epochs``) epochs on the frozen head with
   CE + lambda * L_R(phi(x), P[y]) (Eq. 6), P the global prototypes;
3. local prototypes P_i^(j) (Eq. 4; re-weighted by exp(eps * cos) with Eq. 5).

The server averages phi weighted by train windows (Eq. 7) and the prototypes per class
(Eq. 8), rebuilding them from the round's clients only (a class no client returned is absent).

``variant: code`` (default, since the paper's numbers came from it) keeps the authors' code's
local prototype (cheng-haha/ProtoHAR userProtoHAR.py): its accumulation guard compares the embedding *dimension* with 100,
so P_i^(j) is the embedding of the first class-j sample of the first body epoch scaled by 1/n_j
(unscaled when re-weighting). ``variant: paper`` is the Eq. 4 class mean after local training.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from fedwear.methods import prototypes
from fedwear.methods.api import Record
from fedwear.methods.batched import Pull
from fedwear.methods.fedavg import tensors
from fedwear.methods.fedrep import FedRep, FedRepOptions
from fedwear.methods.prototypes import COUNT, MASK, PROTO
from fedwear.methods.training import host, load_arrays, weighted_mean


class ProtoHAROptions(FedRepOptions):
    head_epochs: int = Field(1, ge=0, description="E_h: the code's plocal_steps default 1 (cheng-haha/ProtoHAR main.py); the paper's default ratio is 3:7")
    head_lr: float | None = Field(0.01, gt=0, description="lr of the head step: the code's personal_learning_rate 0.01 (cheng-haha/ProtoHAR main.py)")
    lamda: float = Field(1.0, ge=0, description="lambda of Eq. 6: 1 for USC-HAD, UNIMIB, HARBOX, 10 for PAMAP2 (paper; code's runexp.sh)")
    distance: Literal["l2", "l1", "cosine"] = Field("l2", description="L_R: l2 = nn.MSELoss over all B x k entries (paper and code default)")
    reweight: float | None = Field(
        None, ge=0, description="epsilon of Eq. 5 (re-weighted prototypes, Table IV); null: off (the main runs). "
        "variant code: any epsilon gives the same prototypes (one embedding per class, its weight cancels; "
        "unscaled by 1/n_j); variant paper: the class mean weighted by exp(epsilon cos)",
    )
    variant: Literal["code", "paper"] = Field("code", description="local prototype: the code's first-sample value or the paper's Eq. 4 mean")
    proto_weighting: Literal["uniform", "count"] = Field(
        "uniform", description="server prototypes: plain mean over clients (code) or count-weighted (Eq. 8)"
    )


class ProtoHAR(FedRep):
    name = "protohar"
    summary = "ProtoHAR (Cheng et al. 2023): FedRep's head/body steps with a global-prototype regulariser on the body."
    kinds = ("classification",)  # class prototypes / class balancing
    Options = ProtoHAROptions
    mean_aggregation = False  # prototypes are a per-class mean over the clients that have the class

    def __init__(self, task, options):
        super().__init__(task, options)
        with torch.no_grad():
            k = self.model.eval().features(torch.zeros(2, task.window, task.channels, device=self.device)).shape[1]
        self.model.train()
        self.empty = {PROTO: np.zeros((task.num_classes, k), np.float32), MASK: np.zeros(task.num_classes, np.float32)}
        #: Classes in the fitting client's train split (``fit`` sets it): ``record_first`` stops
        #: once it has seen them all.
        self.classes = task.num_classes

    # ---- server ---------------------------------------------------------------------------
    def init_server(self):
        return Record({**super().init_server().arrays, **self.empty})

    def aggregate(self, server, replies, round, plan=None):
        if not replies:
            return server
        body = [k for k in server.arrays if k not in self.empty]
        proto, mask = prototypes.aggregate(replies.values(), weighted=self.options.proto_weighting == "count")
        return Record({**weighted_mean(replies.values(), body), PROTO: proto, MASK: mask})  # Eq. 7, Eq. 8

    def reply_spec(self, down):
        spec = {k: a.shape for k, a in down.arrays.items() if k != MASK}
        return {**spec, COUNT: down.arrays[MASK].shape}

    # ---- client ---------------------------------------------------------------------------
    def begin_fit(self, model, down, state):
        self.global_protos = self.on_device(down.arrays[PROTO])
        self.global_mask = self.on_device(down.arrays[MASK])
        self.first: dict[int, torch.Tensor] = {}  # code variant: first embedding seen per class

    def loss(self, model, x, y):
        """Eq. 6: CE(h(phi(x)), y) + lambda * L_R(phi(x), P[y])."""
        z = model.features(x)
        target = prototypes.targets(z, y, self.global_protos, self.global_mask)
        if self.options.variant == "code":
            self.record_first(z, y, target)
        reg = prototypes.distance(z, target, self.options.distance)
        return F.cross_entropy(model.head(z), y) + self.options.lamda * reg

    def record_first(self, z, y, target) -> None:
        """The code's local prototype: the first embedding of each class (from the forward pass
        before the step), scaled by 1/n_j; re-weighting divides by its own weight instead. Reading
        a batch's classes waits for the device: it stops once the client's every class is seen."""
        if len(self.first) >= self.classes:
            return
        for c in torch.unique(y).tolist():
            if c not in self.first:
                self.first[c] = z[(y == c).nonzero()[0, 0]].detach().clone()

    def prepare(self, down, state, data, seed):
        self.classes = len(np.unique(data.train.y))
        return super().prepare(down, state, data, seed)

    def reply(self, model, data, loss):
        """The body, and the local prototypes P_i (Eq. 4)."""
        up = super().reply(model, data, loss)
        proto, count = self.local_prototypes(data)
        up.arrays.update({PROTO: proto, COUNT: count})
        return up

    # ---- clients trained together (engine: batched) -----------------------------------------
    trains_together = True

    def fit_together(self, jobs):
        """``fit`` of every job at once: FedRep's two steps, the body's with the prototype pull
        (Eq. 6) and, in the code variant, each client's first embedding of each class recorded;
        equal to ``fit`` up to float rounding (tests/test_batched.py)."""
        o = self.options
        down = jobs[0][0]  # configure sends every client the server's record
        pull = Pull(self.on_device(down.arrays[PROTO]), self.on_device(down.arrays[MASK]), o.lamda, o.distance)
        heads, bodies = self.train_head_then_body(jobs, pull=pull, num_keys=self.task.num_classes,
                                                  record="first" if o.variant == "code" else None)
        out = []
        for (down, state, data, _), head, body in zip(jobs, heads, bodies, strict=True):
            arrays = {n: host(w).copy() for n, w in body.weights.items()}
            self.begin_fit(self.model, down, state)
            if body.embeddings is not None:  # the code variant's first embeddings
                self.first = {c: body.embeddings[c] for c in np.flatnonzero(host(body.seen)).tolist()}
            else:  # the paper variant's class means, from the trained model
                load_arrays(self.model, arrays)
            up = self.reply_together(arrays, data, body.loss)
            up.arrays.update(zip((PROTO, COUNT), self.local_prototypes(data), strict=True))
            out.append((up, self.kept_together(state, arrays, {"head": head.momentum, "body": body.momentum})))
        return out

    def local_prototypes(self, data) -> tuple[np.ndarray, np.ndarray]:
        x, y = tensors(data)
        q = self.task.num_classes
        counts = torch.bincount(y, minlength=q).float()
        if self.options.variant == "code":
            proto = self.empty[PROTO].copy()
            if self.first:
                first = torch.stack(list(self.first.values())).cpu()  # to the host in one copy
                for c, z in zip(self.first, first, strict=True):
                    proto[c] = (z if self.options.reweight is not None else z / counts[c]).numpy()
            return proto, counts.numpy()
        x, y = x.to(self.device), y.to(self.device)
        with torch.no_grad():
            self.model.eval()
            z = torch.cat([self.model.features(x[i : i + 256]) for i in range(0, len(x), 256)])
            self.model.train()
        if self.options.reweight is None:
            return prototypes.class_means(z, y, q)
        target = prototypes.targets(z, y, self.global_protos, self.global_mask)
        w = torch.exp(self.options.reweight * F.cosine_similarity(z, target, dim=1)).double()  # Eq. 5
        sums = torch.zeros(q, z.shape[1], dtype=torch.float64, device=z.device).index_add_(0, y, w[:, None] * z.double())
        norm = torch.zeros(q, dtype=torch.float64, device=z.device).index_add_(0, y, w).clamp(min=1e-12)
        return host((sums / norm[:, None]).float()), host(counts)


__all__ = ["ProtoHAR"]
