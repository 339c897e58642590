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

from dataclasses import replace
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from fedwear.errors import ConfigError
from fedwear.methods import prototypes
from fedwear.methods.api import Record
from fedwear.methods.fedavg import tensors
from fedwear.methods.fedrep import FedRep, FedRepOptions
from fedwear.methods.prototypes import COUNT, MASK, PROTO
from fedwear.methods.training import host, weighted_mean


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
    dp_part_count = 3  # the body's update, the prototypes, which classes each client holds

    def __init__(self, task, options):
        super().__init__(task, options)
        with torch.no_grad():
            k = self.model.eval().features(torch.zeros(2, task.window, task.channels, device=self.device)).shape[1]
        self.model.train()
        self.empty = {PROTO: np.zeros((task.num_classes, k), np.float32), MASK: np.zeros(task.num_classes, np.float32)}

    # ---- server ---------------------------------------------------------------------------
    def init_server(self):
        return Record({**super().init_server().arrays, **self.empty})

    def aggregate(self, server, replies, round, plan=None):
        if not replies:
            return server
        body = [k for k in server.arrays if k not in self.empty]
        proto, mask = prototypes.aggregate(replies.values(), weighted=self.options.proto_weighting == "count")
        return Record({**weighted_mean(replies.values(), body), PROTO: proto, MASK: mask})  # Eq. 7, Eq. 8

    # ---- central DP (privacy.dp): three noisy sums, the server's state from them -------------
    def dp_bounds(self, settings):
        """The body update to ``clipping_norm``, the prototypes (the ``[Q, k]`` matrix, zero rows for
        classes the client lacks) to ``prototype_clipping_norm``, and the indicator of the classes
        the client holds (norm <= sqrt(Q), not clipped). Eq. 8's mean is then over the clients
        holding a class; the count-weighted mean would need the window counts too."""
        if self.options.proto_weighting == "count":
            raise ConfigError("privacy.dp with protohar's proto_weighting=count: the private prototypes are the "
                              "mean over the clients holding each class; set proto_weighting: uniform")
        return {"update": settings.clipping_norm, "prototypes": settings.prototype_clipping_norm,
                "classes": float(np.sqrt(self.task.num_classes))}

    def dp_parts(self, down, up):
        held = up.arrays[COUNT] > 0
        return {"update": {k: up.arrays[k].astype(np.float64) - down.arrays[k] for k in self.dp_body(down)},
                "prototypes": {PROTO: np.where(held[:, None], up.arrays[PROTO], 0.0)},
                "classes": {MASK: held.astype(np.float64)}}

    def dp_aggregate(self, server, sums, clients):
        """Eq. 7's body mean and Eq. 8's prototypes from the noisy sums: a class is known where its
        noisy count of holders reaches 1/2."""
        holders = sums["classes"][MASK]
        known = holders >= 0.5
        proto = np.where(known[:, None], sums["prototypes"][PROTO] / np.maximum(holders, 1.0)[:, None], 0.0)
        body = {k: (server.arrays[k] + sums["update"][k] / clients).astype(server.arrays[k].dtype)
                for k in self.dp_body(server)}
        return Record({**server.arrays, **body, PROTO: proto.astype(np.float32), MASK: known.astype(np.float32)},
                      dict(server.scalars))

    def dp_body(self, server) -> list[str]:
        """The body's float arrays (its integer batch-norm counters stay the server's)."""
        return [k for k, a in server.arrays.items() if k not in self.empty and a.dtype.kind == "f"]

    def reply_spec(self, down):
        spec = {k: a.shape for k, a in down.arrays.items() if k != MASK}
        return {**spec, COUNT: down.arrays[MASK].shape}

    # ---- client ---------------------------------------------------------------------------
    def prepare(self, fit):
        """The global prototypes P and which classes have one, for Eq. 6."""
        super().prepare(fit)
        fit.inputs.update(prototypes=self.on_device(fit.down.arrays[PROTO]), mask=self.on_device(fit.down.arrays[MASK]))

    def stages(self, fit):
        """FedRep's; the code variant's body step records each class's first embedding (the
        forward pass before the step), its local prototype."""
        head, body = super().stages(fit)
        if self.options.variant == "code":
            body = replace(body, record="first", num_keys=self.task.num_classes)
        return [head, body]

    def loss(self, model, x, y, fit):
        """Eq. 6: CE(h(phi(x)), y) + lambda * L_R(phi(x), P[y]); with the embeddings, by class."""
        z = model.features(x)
        target = prototypes.targets(z, y, fit.inputs["prototypes"], fit.inputs["mask"])
        reg = prototypes.distance(z, target, self.options.distance)
        return F.cross_entropy(model.head(z), y) + self.options.lamda * reg, (z, y)

    def reply(self, fit):
        """The body, and the local prototypes P_i (Eq. 4)."""
        up = super().reply(fit)
        proto, count = self.local_prototypes(fit)
        up.arrays.update({PROTO: proto, COUNT: count})
        return up

    def local_prototypes(self, fit) -> tuple[np.ndarray, np.ndarray]:
        """The code variant: each class's first embedding scaled by 1/n_j (unscaled when
        re-weighting: its own weight cancels); the paper variant: Eq. 4's class means of the
        trained body (re-weighted by Eq. 5)."""
        x, y = tensors(fit.data)
        q = self.task.num_classes
        counts = torch.bincount(y, minlength=q).float()
        if self.options.variant == "code":
            if fit.recorded is None:  # no body step taken
                return self.empty[PROTO].copy(), counts.numpy()
            first, seen = (t.cpu() for t in fit.recorded)  # to the host in one copy each
            scale = torch.ones_like(counts) if self.options.reweight is not None else counts.clamp(min=1)
            proto = torch.where(seen.bool()[:, None], first / scale[:, None], torch.zeros_like(first))
            return proto.numpy(), counts.numpy()
        model = fit.model
        x, y = x.to(self.device), y.to(self.device)
        with torch.no_grad():
            model.eval()
            z = torch.cat([model.features(x[i : i + 256]) for i in range(0, len(x), 256)])
            model.train()
        if self.options.reweight is None:
            return prototypes.class_means(z, y, q)
        target = prototypes.targets(z, y, fit.inputs["prototypes"], fit.inputs["mask"])
        w = torch.exp(self.options.reweight * F.cosine_similarity(z, target, dim=1)).double()  # Eq. 5
        sums = torch.zeros(q, z.shape[1], dtype=torch.float64, device=z.device).index_add_(0, y, w[:, None] * z.double())
        norm = torch.zeros(q, dtype=torch.float64, device=z.device).index_add_(0, y, w).clamp(min=1e-12)
        return host((sums / norm[:, None]).float()), host(counts)


__all__ = ["ProtoHAR"]
