"""FedPCL (Tan, Long, Ma, Liu, Zhou, Jiang, "Federated Learning from Pre-Trained Models: A
Contrastive Learning Approach", NeurIPS 2022; the authors' code: github.com/yuetan031/FedPCL).

In the paper each client feeds its inputs to fixed pre-trained backbones and trains only a
small projection network on top; no weights cross the network, only class prototypes:

- Client i's representation of x is ``z = P_i(f(x))``: the projection ``P_i`` (the code's
  ``ProjandDeci``: Linear(k, 256), ReLU, L2 normalisation) of the frozen backbone features.
  ``P_i`` stays on client i (personalised fusion; never averaged).
- Local prototype of class j (Sec. 4.1): ``C_i^(j)`` = mean of ``z`` over client i's class-j
  samples, computed after local training (the code's ``generate_protos`` /
  ``update_weights_lg``'s last pass, model in eval mode, no renormalisation).
- Global prototype (Sec. 4.1): ``C̄^(j)`` = plain mean of ``C_i^(j)`` over the clients that
  have class j (the code's ``proto_aggregation``). The server sends the global prototypes
  *and* the set of the clients' local prototypes, a class a client lacks filled in with the
  global one (the code's ``update_weights_lg``).
- Local objective (Sec. 4.2): ``L = L_g + L_p`` with the global prototype-wise contrastive loss
  ``L_g = -log( exp(s(z, C̄^(y))/τ) / Σ_j exp(s(z, C̄^(j))/τ) )`` and the local one
  ``L_p = (1/m) Σ_k -log( exp(s(z, C_k^(y))/τ) / Σ_j exp(s(z, C_k^(j))/τ) )`` over the m clients'
  prototype sets, τ = 0.07; ``s`` is the dot product of the normalised ``z`` with a prototype
  (both codes: the code's ``ConLoss`` and PFLlib's ``clientPCL`` take ``z · C`` with
  prototypes as averaged). :func:`prototype_contrastive_loss` computes either term; a class
  without a global prototype is left out of the softmax and its samples add 0.

Deviations, all fedwear's (the code runs on images and classifies by the nearest local
prototype; PCFedH, Yin et al. FITEE 2025, Table 2, compares against FedPCL on heart-rate
forecasting without saying how its authors adapted it):

- **Prediction path.** A head (Linear(d, outputs)) on ``z`` trained with the task's loss: the
  objective is ``criterion(head(z), y) + ld · (L_g + L_p)``. fedwear's evaluation needs a model
  output (logits for AUC, a heart rate for regression) and a regression task has no
  nearest-prototype answer finer than a bin. ``task_loss: false`` keeps the paper's objective
  for the representation (``L_g + L_p`` only) and fits the head on detached features.
- **The backbone.** There is no pre-trained backbone for heart rate (nor for fedwear's HAR
  models), so the configured model's body plays it. ``backbone: local`` (default): each client
  trains it with the objective above and keeps it: its representation has to be learnt
  somewhere, which is what pre-training did for the paper, while FedPCL's communication
  (prototypes only) and losses are unchanged. ``backbone: frozen``: the body keeps its
  initial weights (from the run seed, the same on every client, in eval mode) and only the
  projection and head train: the paper's structure literally, with random features in place
  of pre-trained ones.
- **Regression.** The classes are target bins (:func:`fedwear.methods.prototypes.target_bins`,
  default 16 x 10 bpm over 40-200 bpm), as for FedProto (see ``fedproto.py``): windows whose
  next heart rate falls in the same bin share a prototype.
- **One view.** The code contrasts two augmented views of each image; heart-rate windows have
  no agreed augmentation, so the loss uses one view, as PFLlib's port does.
- **Selection.** The run's schedule (the code trains every client every round); the local set
  holds this round's replies (the code: every client's latest prototypes).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedwear.data.types import ClientData
from fedwear.methods import prototypes
from fedwear.methods.api import Plan, Record, Task
from fedwear.methods.fedavg import FedAvg, tensors
from fedwear.methods.prototypes import COUNT, MASK, PROTO, TargetBinOptions
from fedwear.models import SplitModel

#: The clients' local prototypes in a server message: ``[m, Q, d]``, missing classes filled in.
PROTO_SET = "proto_set"
#: Parameter-name prefix of the backbone inside the projected model (``body.0``).
BACKBONE = "body.0"


class FedPCLOptions(TargetBinOptions):
    temperature: float = Field(
        0.07, gt=0, description="temperature tau of L_g and L_p (Tan et al. 2022, Sec. 4.2); the "
        "authors' code: ConLoss(temperature=0.07), yuetan031/FedPCL",
    )
    projection_dim: int = Field(
        256, ge=1, description="output size d of the projection network; the authors' code: "
        "ProjandDeci(in_d, 256, num_classes)",
    )
    ld: float = Field(
        1.0, ge=0, description="weight of L_g + L_p next to the task loss; fedwear's (the paper's "
        "objective is L_g + L_p alone): 1 keeps the paper's sum unscaled",
    )
    backbone: Literal["local", "frozen"] = Field(
        "local", description="what plays the pre-trained backbone (none exists for heart rate): "
        "local = the model's body, trained and kept by each client (fedwear's default); frozen = "
        "the body at its initial weights (run seed, the same on every client), only the "
        "projection and head train, as the paper's fixed backbones",
    )
    task_loss: bool = Field(
        True, description="train the representation with the task loss as well (fedwear's default, "
        "so the head regresses on features that keep more than the bin); false: the paper's "
        "objective L_g + L_p shapes the representation alone, the head is fitted on detached "
        "features",
    )


class Projection(nn.Module):
    """``Linear(k, d)``, ReLU, L2 normalisation (the code's ``ProjandDeci`` up to its ``x1``)."""

    def __init__(self, k: int, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(k, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.normalize(F.relu(self.fc(h)), dim=1)


class Projected(SplitModel):
    """``body`` = the model's body (the backbone, ``body.0``) + :class:`Projection` (``body.1``);
    ``head`` = ``Linear(d, outputs)``; k = the size of the model's body output."""

    def __init__(self, model: SplitModel, window: int, channels: int, dim: int, outputs: int) -> None:
        super().__init__()
        with torch.no_grad():
            probe = torch.zeros(2, window, channels, device=next(model.parameters()).device)
            k = model.eval().body(probe).shape[1]
        self.body = nn.Sequential(model.body, Projection(k, dim))
        self.head = nn.Linear(dim, outputs)
        self.train()


def prototype_contrastive_loss(z: torch.Tensor, key: torch.Tensor, protos: torch.Tensor,
                               mask: torch.Tensor, tau: float, any_present: bool | None = None) -> torch.Tensor:
    """FedPCL's prototype-wise contrastive loss (Sec. 4.2): ``L_g`` with ``protos`` = the global
    prototypes ``[Q, d]``, ``L_p`` with ``protos`` = the clients' sets ``[m, Q, d]`` (averaged
    over the m sets).

    For each sample b and set: ``-log softmax_j(z_b · C_j / τ)[key_b]`` over the prototypes j
    with ``mask[j] = 1``. A sample whose key has no prototype adds 0 but counts in the batch
    mean (as FedProto's regulariser, ``prototypes.targets``). Zero without prototypes.
    ``any_present``: whether ``mask`` has a 1, when the caller knows it on the host (reading it
    from ``mask`` waits for the device); None: read from ``mask``.
    """
    if protos.dim() == 2:
        protos = protos.unsqueeze(0)
    present = mask.bool()
    if any_present is None:
        any_present = bool(present.any())
    if protos.shape[0] == 0 or not any_present:
        return z.new_zeros(())
    logits = torch.einsum("bd,mqd->mbq", z, protos) / tau
    log_p = F.log_softmax(logits.masked_fill(~present, float("-inf")), dim=-1)
    picked = log_p.gather(-1, key.expand(protos.shape[0], -1).unsqueeze(-1)).squeeze(-1)  # [m, B]
    return -torch.where(present[key], picked, torch.zeros_like(picked)).mean()


class FedPCL(FedAvg):
    name = "fedpcl"
    summary = ("FedPCL (Tan et al. 2022): clients keep their models and share class prototypes; a projection "
               "is trained with contrastive losses to the global and every client's prototypes (regression: "
               "prototypes of target bins, fedwear's adaptation).")
    Options = FedPCLOptions
    shared = ()
    personal = ("body", "head")
    mean_aggregation = False

    def __init__(self, task: Task, options: FedPCLOptions) -> None:
        super().__init__(task, options)
        self.dim = options.projection_dim
        #: Prototypes per message: classes, or target bins for a regression task.
        self.num_keys = prototypes.num_keys(task, options)
        #: The parameters a client trains: all, or the projection and head on a frozen backbone.
        self.trained: tuple[str, ...] = ("body", "head") if options.backbone == "local" else ("body.1", "head")

    def new_model(self) -> SplitModel:
        """The configured model with FedPCL's projection, initialised from the run seed."""
        model = super().new_model()
        with torch.random.fork_rng():
            torch.manual_seed(self.task.training.seed)
            t = self.task
            return Projected(model, t.window, t.channels, self.options.projection_dim, t.num_outputs).to(self.device)

    # ---- server -------------------------------------------------------------------------
    def init_server(self) -> Record:
        q, d = self.num_keys, self.dim
        return Record({PROTO: np.zeros((q, d), np.float32), MASK: np.zeros(q, np.float32),
                       PROTO_SET: np.zeros((0, q, d), np.float32)})

    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        """Global prototypes = the unweighted mean per class over this round's replies; the local
        set = the replies' prototypes (by client id), a class a client lacks = the global one."""
        if not replies:
            return server
        ordered = [replies[c] for c in sorted(replies)]
        proto, mask = prototypes.aggregate(ordered, weighted=False)
        local = np.stack([np.where(r.arrays[COUNT][:, None] > 0, r.arrays[PROTO], proto) for r in ordered])
        return Record({PROTO: proto, MASK: mask, PROTO_SET: local.astype(np.float32)}, dict(server.scalars))

    def reply_spec(self, down: Record) -> dict[str, tuple[int, ...] | None]:
        return {PROTO: (self.num_keys, self.dim), COUNT: (self.num_keys,)}

    def global_message(self, server: Record) -> Record | None:
        return None

    # ---- client -------------------------------------------------------------------------
    def prepare(self, fit):
        """This round's global prototypes, their mask and the clients' prototype sets."""
        super().prepare(fit)
        fit.inputs.update(prototypes=self.on_device(fit.down.arrays[PROTO]), mask=self.on_device(fit.down.arrays[MASK]),
                          proto_set=self.on_device(fit.down.arrays[PROTO_SET]))
        fit.notes["any_present"] = bool(fit.down.arrays[MASK].any())  # on the host: no wait for the device per batch

    def represent(self, model: Projected, x: torch.Tensor) -> torch.Tensor:
        """``z``; with a frozen backbone its features come from eval mode without gradients."""
        if self.options.backbone == "frozen":
            backbone = model.body[0].eval()
            with torch.no_grad():
                h = backbone(x)
            return model.body[1](h)
        return model.features(x)

    #: The loss is zero until some prototype is known, a branch the vectorised step cannot take.
    trains_together = False

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, fit) -> torch.Tensor:
        """``criterion(head(z), y) + ld · (L_g + L_p)`` (``z`` detached in the head's term when
        ``task_loss`` is off)."""
        o = self.options
        z = self.represent(model, x)
        key = prototypes.keys(y, self.task, o)
        mask, known = fit.inputs["mask"], fit.notes["any_present"]
        con = (prototype_contrastive_loss(z, key, fit.inputs["prototypes"], mask, o.temperature, known)
               + prototype_contrastive_loss(z, key, fit.inputs["proto_set"], mask, o.temperature, known))
        out = model.head(z if o.task_loss else z.detach())
        return self.criterion(out, y) + o.ld * con

    @property
    def trained_parts(self) -> tuple[str, ...]:
        return self.trained

    def reply(self, fit):
        """The local prototypes (never the model)."""
        proto, count = self.local_prototypes(fit.model, fit.data)
        return Record({PROTO: proto, COUNT: count}, {"num_examples": len(fit.data.train), "loss": fit.loss})

    def local_prototypes(self, model: Projected, data: ClientData) -> tuple[np.ndarray, np.ndarray]:
        """Per-key means of ``z`` over the train split after training (eval mode) and the counts."""
        x, y = tensors(data)
        model.eval()
        with torch.no_grad():
            z = model.features(x.to(self.device))
        return prototypes.class_means(z, prototypes.keys(y, self.task, self.options), self.num_keys)

    def client_state(self, fit) -> Record:
        """FedAvg's (the whole model, optimiser state with ``optimizer.persist``), without a
        frozen backbone: it never leaves its initial weights."""
        state = super().client_state(fit)
        if self.options.backbone == "frozen":
            state.arrays = {k: v for k, v in state.arrays.items() if not k.startswith(BACKBONE + ".")}
        return state

    def adapt(self, down: Record, data: ClientData, seed: int) -> Record:
        """fedwear's choice (the paper has no unseen clients): a new client trains its own model
        from the initial weights with the FedPCL objective toward the received prototypes, for
        ``evaluation.adapt_epochs`` epochs."""
        return self.train_personal(down, data, seed, self.trained, prepared=True)


__all__ = ["FedPCL", "prototype_contrastive_loss"]
