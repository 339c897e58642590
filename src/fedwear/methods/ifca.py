"""IFCA (Ghosh et al., "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020,
Algorithm 2 with model averaging): a PCFedH Table 2 baseline.

The server keeps ``clusters`` models (``cluster{k}.<param>``), started from K independent random
initialisations (``derive_seed(seed, "cluster", k)``, as PCFedH's cluster models). Each client
of the round receives all K, estimates its cluster identity
``k_i = argmin_k L(w_k; D_i)`` (the task's loss, cross-entropy or MSE, averaged over its train
split; ties go to the lowest k), runs FedAvg's local training from ``w_{k_i}`` and replies its
model and ``k_i`` (the scalar ``cluster``). The server sets every chosen cluster model to the
sample-weighted mean (FedAvg's weights, ``num_examples``) of the replies that chose it; a
cluster nobody chose keeps its model. Nothing keeps the clusters apart at the start: when every
client finds the same initial model the lowest-loss one, only it ever trains and IFCA runs FedAvg
from it (so on PPG-DaLiA and Stress-Predict heart rate: ``scripts/cluster_use.py``).

Evaluation: a client's personal model is the cluster model with the lowest loss on its own
train split at evaluation time (``personalize``); a new client chooses the same way (``adapt``,
no training). There is no single global model (``global_message`` is None).

Default ``clusters=4``: the K PCFedH's code uses for PPG-DaLiA (pcfedh/pcfedh main.py; 5 for
distracted driving).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from fedwear.data.types import ClientData
from fedwear.methods.api import Options, Plan, Record, Task
from fedwear.methods.fedavg import tensors
from fedwear.methods.soft_clustering import CLUSTER, ClusterModels
from fedwear.methods.training import host, load_arrays, weighted_mean
from fedwear.models import SplitModel

#: Scalar of a reply (and of a personalized state): the index of the chosen cluster model.
CHOSEN = "cluster"


class IFCAOptions(Options):
    clusters: int = Field(
        4, ge=1,
        description="K cluster models on the server (PCFedH's code: 4 for PPG-DaLiA, 5 for distracted driving; "
        "pcfedh/pcfedh main.py)",
    )


class IFCA(ClusterModels):
    name = "ifca"
    summary = ("IFCA (Ghosh et al. 2020): K cluster models; each client trains the one with the lowest loss "
               "on its data and the server averages each cluster's replies.")
    Options = IFCAOptions

    def __init__(self, task: Task, options: IFCAOptions) -> None:
        super().__init__(task, options)
        self.opt: IFCAOptions = options

    # ---- server -------------------------------------------------------------------------
    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        """Per cluster, the sample-weighted mean of the replies that chose it; the others stay."""
        arrays = dict(server.arrays)
        names = list(self.initial)
        for k in range(self.opt.clusters):
            chose = [r for r in replies.values() if int(r.scalars[CHOSEN]) == k]
            if chose:
                arrays.update({CLUSTER.format(k) + n: a for n, a in weighted_mean(chose, names).items()})
        return Record(arrays, dict(server.scalars))

    def global_message(self, server: Record) -> Record | None:
        return None

    def reply_spec(self, down: Record) -> dict[str, tuple[int, ...] | None]:
        """One model (the chosen cluster's, trained); the choice travels as a scalar."""
        return {n: a.shape for n, a in self.initial.items()}

    def validate_reply(self, down: Record, reply: Record) -> str | None:
        why = super().validate_reply(down, reply)
        if why is not None:
            return why
        k = reply.scalars.get(CHOSEN)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.opt.clusters:
            return f"scalar {CHOSEN!r} is {k!r}, expected a cluster index below {self.opt.clusters}"
        return None

    # ---- client -------------------------------------------------------------------------
    def cluster_model(self, down: Record, k: int) -> SplitModel:
        """The method's one model object holding cluster ``k``'s weights from ``down``."""
        prefix = CLUSTER.format(k)
        load_arrays(self.model, {**self.initial, **{n: down.arrays[prefix + n] for n in self.initial}})
        return self.model

    @torch.no_grad()
    def cluster_losses(self, down: Record, data: ClientData) -> np.ndarray:
        """The task's loss of every cluster model, averaged over the client's train windows
        (summed on the model's device in float64, as Python's float sum: one copy to the host)."""
        x, y = (t.to(self.device) for t in tensors(data))
        bs = self.task.training.eval_batch_size
        totals = []
        for k in range(self.opt.clusters):
            model = self.cluster_model(down, k)
            model.eval()
            total = torch.zeros((), dtype=torch.float64, device=x.device)
            for i in range(0, len(y), bs):
                yb = y[i:i + bs]
                total += self.criterion(model(x[i:i + bs]), yb).double() * len(yb)
            totals.append(total)
        return host(torch.stack(totals)) / max(len(y), 1)

    def choose(self, down: Record, data: ClientData) -> int:
        """``argmin_k L(w_k; D_i)`` (IFCA's cluster identity estimate; the first k on ties)."""
        return int(np.argmin(self.cluster_losses(down, data)))

    def prepare(self, fit):
        """The cluster model with the lowest loss on the client's data."""
        fit.notes[CHOSEN] = self.choose(fit.down, fit.data)
        fit.model = self.cluster_model(fit.down, fit.notes[CHOSEN])

    def reply(self, fit):
        up = super().reply(fit)
        up.scalars[CHOSEN] = fit.notes[CHOSEN]
        return up

    # ---- evaluation ---------------------------------------------------------------------
    def personalize(self, down: Record, state: Record, data: ClientData, seed: int) -> Record:
        """The client's state plus the cluster whose model has the lowest loss on its train split now."""
        return Record(dict(state.arrays), {**state.scalars, CHOSEN: self.choose(down, data)})

    def adapt(self, down: Record, data: ClientData, seed: int) -> Record:
        """A new client chooses its cluster as a training client does (no training)."""
        return Record({}, {CHOSEN: self.choose(down, data)})

    def personal_predictor(self, down, state):
        """The chosen cluster's model (None before a cluster was chosen)."""
        k = state.scalars.get(CHOSEN)
        return None if k is None else self.predictor(self.cluster_model(down, int(k)))


__all__ = ["IFCA"]
