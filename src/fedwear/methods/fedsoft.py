"""FedSoft (Ruan and Joe-Wong, "FedSoft: Soft Clustered Federated Learning with Proximal Local
Updating", AAAI 2022, Algorithm 1): soft clustered FL whose importance weights come from the
cluster models' losses.

Every ``estimation_interval`` training rounds, an estimation round comes first: every client
finds, for each of its train windows, the cluster model with the lowest loss, counts them per
cluster (``n_ik``), keeps ``u_ik = n_ik / n_i`` (empty: ``smoother``) and sends the counts; the
server sets ``v_ik = n_ik / sum_j n_jk``. Training rounds are
:class:`fedwear.methods.soft_clustering.SoftClustered`'s: ``per_cluster`` clients drawn per cluster
by ``v_.k``, the proximal local objective, cluster models as plain means (ycruan/FedSoft servers.py; the same as
PCFedH's module 2; only how ``u`` is obtained differs). It is PCFedH's "w/o DCP" ablation
(Table 3). ``rounds`` counts the estimation rounds too: 500 training rounds with
``estimation_interval: 1`` take ``rounds: 1000``; ``evaluation.every`` counts training rounds.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from fedwear.data.types import ClientData
from fedwear.methods.api import Record
from fedwear.methods.fedavg import tensors
from fedwear.methods.soft_clustering import SoftClustered, SoftClusterOptions, U, importance
from fedwear.methods.training import host, load_arrays

ESTIMATE, TRAIN = 1, 2


class FedSoftOptions(SoftClusterOptions):
    estimation_interval: int = Field(
        1, ge=1, description="training rounds between importance estimations (ycruan/FedSoft: every round)"
    )


class FedSoft(SoftClustered):
    name = "fedsoft"
    summary = "FedSoft (Ruan and Joe-Wong 2022): soft clustered FL, importance weights from the cluster models' per-window losses."
    Options = FedSoftOptions

    def phase(self, round: int) -> int:
        return ESTIMATE if (round - 1) % (self.options.estimation_interval + 1) == 0 else TRAIN

    def training_round(self, round: int) -> int:
        """How many training rounds have run by the end of ``round``."""
        cycle = self.options.estimation_interval + 1
        return round - (round - 1) // cycle - 1

    def evaluation_due(self, round: int, every: int, last: int) -> bool:
        t = self.training_round(round)
        return self.phase(round) == TRAIN and (t % every == 0 or round == last)

    def select(self, server, round, scheduled, all_clients):
        return list(all_clients) if self.phase(round) == ESTIMATE else self.draw(server, round, all_clients)

    def configure(self, server: Record, client: str, round: int) -> Record:
        return Record(self.cluster_arrays(server), {"phase": self.phase(round)})

    def aggregate(self, server, replies, round, plan=None):
        if not replies:
            return server
        arrays = dict(server.arrays)
        if self.phase(round) == ESTIMATE:
            arrays.update(self.shares_of(replies))
        else:
            self.average_clusters(arrays, replies, plan)
        return Record(arrays, dict(server.scalars))

    def reply_spec(self, down: Record) -> dict[str, tuple[int, ...] | None]:
        if down.scalars["phase"] == ESTIMATE:
            return {"counts": (self.options.clusters,)}
        return {k: a.shape for k, a in self.initial.items()}

    def fit(self, down, state, data, round, seed):
        torch.manual_seed(seed)
        if down.scalars["phase"] == TRAIN:
            return self.fit_soft(down, state, data, seed, self.options.reg_weight)
        counts = self.min_loss_counts(down, data)
        kept = Record({**state.arrays, U: importance(counts, self.options.smoother)})
        return Record({"counts": counts}, {"num_examples": len(data.train)}), kept

    def min_loss_counts(self, down: Record, data: ClientData) -> np.ndarray:
        """``n_ik``: the client's train windows on which cluster model k has the lowest loss."""
        x, y = (t.to(self.device) for t in tensors(data))
        model = self.model
        losses = []
        for k in range(self.options.clusters):
            load_arrays(model, {n: down.arrays[f"cluster{k}.{n}"] for n in self.initial})
            model.eval()
            with torch.no_grad():
                out = torch.cat([model(x[i:i + 1024]) for i in range(0, len(x), 1024)])
            losses.append(self.per_window_loss(out, y))
        best = host(torch.stack(losses).argmin(dim=0))
        return np.bincount(best, minlength=self.options.clusters).astype(np.float64)

    def per_window_loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.task.kind == "regression":
            return (out.squeeze(-1) - y) ** 2
        return torch.nn.functional.cross_entropy(out, y, reduction="none")


__all__ = ["FedSoft"]
