"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, "FedProto: Federated Prototype Learning
across Heterogeneous Clients", AAAI 2022; the authors' code: github.com/yuetan031/FedProto).

No model weights cross the network: each client keeps its whole model (and, with
``optimizer.persist``, its optimiser) and the server exchanges class prototypes only.

- Client i, local objective (Alg. 1, LocalUpdate): ``CE(head(z), y) + λ · MSE(z, C̄^(y))``, the
  embedding ``z = body(x)``, ``C̄^(y)`` the global prototype of the sample's class (its own
  detached embedding when the class has none, so it adds nothing: the code's ``proto_new``).
- Client i, local prototypes (Eq. 3): per-class means of the embeddings. The code
  (``update_weights_het``) collects the embeddings of the forward passes, taken before each
  optimiser step, of the *last* local epoch only; so does :meth:`FedProto.reply`.
- Server (Alg. 1, the code's ``proto_aggregation`` in ``lib/utils.py``): class j's global
  prototype is the plain mean over the clients that returned class j this round; classes
  nobody returned are absent.

Prediction is each client's own model (the code's "w/o protos" accuracy). Selection follows
the run's schedule (the code trains every client every round: ``clients_per_round: 1.0``).

**Regression (heart-rate forecasting): fedwear's adaptation.** FedProto is defined for class
labels only. PCFedH (Yin et al., FITEE 2025, Table 2) reports FedProto on heart-rate forecasting
but does not say how its authors turned it into a regressor, so
what runs here is our choice, and results rows are marked as such:

- the prototypes are keyed by *target bins* instead of classes: a target's value in its own
  units (bpm, ``y * scale + shift`` with ``task.target``) falls into one of ``bins`` bins of
  ``bin_width`` from ``bin_low`` (default 16 x 10 bpm over 40-200 bpm; outside values are
  clipped to the first or last bin; :func:`fedwear.methods.prototypes.target_bins`);
- the local objective is ``MSE(head(z), y) + λ · MSE(z, C̄^(bin(y)))``: the task's loss in place
  of CE, the regulariser unchanged with the bin's global prototype (none yet: no pull);
- clients send per-bin mean embeddings and counts; the server averages per bin exactly as per
  class (plain mean over the clients that returned the bin).

Why bins of the target: the regulariser needs groups of samples whose embeddings should agree
across clients; windows with the same next heart rate are the regression analogue of a class,
fixed bins in bpm mean the same thing on every client (no shared clustering is needed, no
extra communication), and equal widths in bpm keep them independent of any client's
distribution. With 10 bpm a PPG-DaLiA client's train windows fall into 8-12 bins (median about
100-180 windows per bin), a distracted-driving client's into 4-5: several prototypes per client,
most of them backed by many windows.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from pydantic import Field
from torch import nn

from fedwear.data.types import ClientData
from fedwear.methods import prototypes
from fedwear.methods.api import Plan, Record, Task
from fedwear.methods.fedavg import FedAvg
from fedwear.methods.prototypes import COUNT, MASK, PROTO, TargetBinOptions


class FedProtoOptions(TargetBinOptions):
    ld: float = Field(
        1.0, ge=0,
        description="weight lambda of the prototype regulariser (Tan et al. 2022); 1 as in the authors' scripts (--ld 1)",
    )


class FedProto(FedAvg):
    name = "fedproto"
    summary = ("FedProto (Tan et al. 2022): clients keep their models and share class prototypes, pulled toward "
               "the global ones (regression: prototypes of target bins, fedwear's adaptation).")
    kinds = ("classification", "regression")  # regression: target bins as classes (module docstring)
    Options = FedProtoOptions
    shared = ()
    personal = ("body", "head")
    mean_aggregation = False
    no_dp_reason = ("its prototypes are per-class means over the clients that hold each class; their private form "
                    "is not built yet")

    def __init__(self, task: Task, options: FedProtoOptions) -> None:
        super().__init__(task, options)
        with torch.no_grad():
            self.dim = int(self.model.eval().features(torch.zeros(1, task.window, task.channels, device=self.device)).shape[1])
        #: Prototypes per message: classes, or target bins for a regression task.
        self.num_keys = prototypes.num_keys(task, options)

    # ---- server -------------------------------------------------------------------------
    def init_server(self) -> Record:
        q = self.num_keys
        return Record({PROTO: np.zeros((q, self.dim), np.float32), MASK: np.zeros(q, np.float32)})

    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        """Global prototypes from this round's replies only (unweighted over clients, absent classes masked)."""
        if not replies:
            return server
        proto, mask = prototypes.aggregate(replies.values(), weighted=False)
        return Record({PROTO: proto, MASK: mask}, dict(server.scalars))

    def reply_spec(self, down: Record) -> dict[str, tuple[int, ...] | None]:
        return {PROTO: (self.num_keys, self.dim), COUNT: (self.num_keys,)}

    # ---- client -------------------------------------------------------------------------
    def prepare(self, fit):
        """This round's global prototypes and which keys have one, for the regulariser."""
        super().prepare(fit)
        fit.inputs.update(prototypes=self.on_device(fit.down.arrays[PROTO]), mask=self.on_device(fit.down.arrays[MASK]))

    def stages(self, fit):
        """FedAvg's, recording the last epoch's embeddings per key (Eq. 3; the code's update_weights_het)."""
        return [replace(stage, record="last_epoch", num_keys=self.num_keys) for stage in super().stages(fit)]

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, fit):
        """``criterion(head(z), y) + λ · MSE(z, C̄^(key))``, key = the class or the target's bin;
        with the embeddings, by key."""
        z = model.features(x)
        key = prototypes.keys(y, self.task, self.options)
        target = prototypes.targets(z, key, fit.inputs["prototypes"], fit.inputs["mask"])
        return self.criterion(model.head(z), y) + self.options.ld * prototypes.distance(z, target, "l2"), (z, key)

    @property
    def trained_parts(self) -> tuple[str, ...]:
        return self.personal

    def reply(self, fit):
        """The local prototypes: per-key means of the last epoch's embeddings (Eq. 3)."""
        if fit.recorded is None:  # local_epochs = 0: nothing seen, nothing to share
            proto, count = np.zeros((self.num_keys, self.dim), np.float32), np.zeros(self.num_keys, np.float32)
        else:
            proto, count = prototypes.means(*fit.recorded)
        return Record({PROTO: proto, COUNT: count}, {"num_examples": len(fit.data.train), "loss": fit.loss})

    def global_message(self, server: Record) -> Record | None:
        return None

    def adapt(self, down: Record, data: ClientData, seed: int) -> Record:
        """fedwear's choice (the paper has no unseen clients): a new client trains its own model
        from the initial weights with the FedProto objective toward the received prototypes,
        for ``evaluation.adapt_epochs`` epochs."""
        return self.train_personal(down, data, seed, self.personal, prepared=True)


__all__ = ["FedProto"]
