"""Soft clustered FL, the part FedSoft and PCFedH share (FedSoft: Ruan and Joe-Wong, AAAI 2022,
Algorithm 1; PCFedH: Yin et al., FITEE 2025, Algorithm 2 and Eq. 11-12; pcfedh/pcfedh and ycruan/FedSoft servers.py).

The server keeps K cluster models (``cluster{k}.<param>``, K independent initialisations) and,
per client i, its share ``v_i`` of each cluster (``v.<client>``, ``v_ik = n_ik / sum_j n_jk``).
A round draws, per cluster k, ``per_cluster`` clients without replacement with probabilities
``v_.k`` (a :class:`Selection` whose plan says who was drawn for which cluster); each drawn client
trains its own persistent model once, from where it left it, on
``loss + (lambda / 2) sum_k u_ik ||w_i - w_k||^2`` with its importance weights ``u_i`` (kept on
the client); each cluster model becomes the plain mean of the models drawn for it. How ``u`` and
``v`` are obtained is what the subclasses differ in.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field
from torch import nn

from fedwear.data.types import ClientData
from fedwear.methods import clustering
from fedwear.methods.api import Options, Plan, Record, Selection, Task
from fedwear.methods.fedavg import PARTS, FedAvg
from fedwear.methods.fit import Fit
from fedwear.methods.proximal import centres, proximal
from fedwear.methods.training import load_arrays, model_arrays
from fedwear.models import build_model
from fedwear.seeding import derive_seed

CLUSTER, U, V = "cluster{}.", "u", "v."


class SoftClusterOptions(Options):
    clusters: int = Field(4, ge=1, description="K cluster models (PCFedH's code: 4 for PPG-DaLiA, 5 for distracted driving)")
    per_cluster: int = Field(5, ge=1, description="M, clients drawn per cluster and round (PCFedH's code: 5 / 20)")
    reg_weight: float = Field(1e-3, ge=0, description="lambda of the proximal term (PCFedH's code: 1e-3)")
    smoother: float = Field(1e-4, ge=0, description="u_ik of a cluster with none of the client's windows (PCFedH's code: 1e-4)")


def cluster_initial(task: Task, k: int) -> list[dict[str, np.ndarray]]:
    """K independent initialisations of the configured model, each from its own seed."""
    cfg = task.training
    out = []
    for j in range(k):
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(cfg.seed, "cluster", j))
            model = build_model(cfg.model, task.window, task.channels, task.num_outputs, **cfg.model_options)
        out.append(model_arrays(model, PARTS))
    return out


def importance(counts: np.ndarray, smoother: float) -> np.ndarray:
    """``u_ik = n_ik / n_i``, an empty cluster counting ``smoother`` (PCFedH Eq. 9; its code)."""
    u = counts / max(float(counts.sum()), 1.0)
    u[counts == 0] = smoother
    return u


class ClusterModels(FedAvg):
    """K models on the server (``cluster{k}.<param>``, from :func:`cluster_initial`), sent to
    every client: what IFCA, FedCE, FedSoft and PCFedH start from. ``options.clusters`` is K."""

    shared = ()
    personal = ()
    mean_aggregation = False  # a mean per cluster, not one mean of all replies
    no_dp_reason = ("its server weighs each client's reply by memberships it computes from that client's own "
                    "statistics, not one mean")
    same_model_for_all = False  # a model per cluster

    def __init__(self, task: Task, options: Options) -> None:
        super().__init__(task, options)
        self.cluster_initial = cluster_initial(task, options.clusters)

    def init_server(self) -> Record:
        return Record({CLUSTER.format(k) + n: a for k, init in enumerate(self.cluster_initial) for n, a in init.items()})

    def configure(self, server: Record, client: str, round: int) -> Record:
        """All K cluster models."""
        return Record(dict(server.arrays))

    @property
    def trained_parts(self) -> tuple[str, ...]:
        return PARTS  # the whole model the client starts from, whichever cluster's it is

    def reply(self, fit):
        """The trained model, for the server to fold into the clusters it was drawn for."""
        return Record(model_arrays(fit.model, PARTS), {"num_examples": len(fit.data.train), "loss": fit.loss})


class SoftClustered(ClusterModels):
    """The machinery above; subclasses decide the rounds and how ``u`` and ``v`` are estimated."""

    personal = PARTS

    def cluster_arrays(self, server: Record) -> dict[str, np.ndarray]:
        return {k: a for k, a in server.arrays.items() if k.startswith("cluster")}

    def draw(self, server: Record, round: int, all_clients: list[str], shares: np.ndarray | None = None) -> Selection:
        """Per cluster, ``per_cluster`` clients without replacement with probabilities ``v_.k``
        (``shares``: ``[N, K]``, default the server's ``v``); the round's seed draws."""
        rng = np.random.default_rng(derive_seed(self.task.training.seed, "select", round))
        v = np.stack([server.arrays[V + c] for c in all_clients]) if shares is None else shares
        plan: Plan = {}
        for k in range(v.shape[1]):
            m = min(self.options.per_cluster, int(np.count_nonzero(v[:, k])))
            if m:
                drawn = rng.choice(len(all_clients), m, replace=False, p=v[:, k] / v[:, k].sum())
                plan[str(k)] = [all_clients[i] for i in sorted(drawn)]
        chosen = {c for group in plan.values() for c in group}
        return Selection([c for c in all_clients if c in chosen], plan)

    def average_clusters(self, arrays: dict[str, np.ndarray], replies: dict[str, Record], plan: Plan | None) -> None:
        """Each cluster model := the plain mean of the replies drawn for it (``1 / M``, Algorithm 2 line 20)."""
        for k, group in (plan or {}).items():
            got = [replies[c] for c in group if c in replies]
            for name in self.cluster_initial[0] if got else ():
                arrays[CLUSTER.format(k) + name] = np.mean([r.arrays[name] for r in got], axis=0).astype(np.float32)

    def shares_of(self, replies: dict[str, Record], key: str = "counts") -> dict[str, np.ndarray]:
        """``v.<client>`` from the replies' per-cluster counts (Eq. 10, empty counts as the code)."""
        ids = list(replies)
        counts = np.stack([replies[c].arrays[key] for c in ids])
        sizes = np.array([float(replies[c].scalars["num_examples"]) for c in ids])
        shares = clustering.cluster_shares(counts, sizes)
        return {V + c: shares[i] for i, c in enumerate(ids)}

    def fit_soft(self, down: Record, state: Record, data: ClientData, seed: int, lam: float,
                 start: dict[str, np.ndarray] | None = None) -> tuple[Record, Record]:
        """One drawn client: its persistent model (or ``start``) trained on the task's loss plus
        :func:`~fedwear.methods.proximal.proximal` towards the cluster models in ``down``."""
        fit = Fit(down, state, data, seed)
        fit.model = model = self.load(Record(), state)
        if start is not None:
            load_arrays(model, start)
        u = state.arrays[U]
        towards = centres([[self.on_device(down.arrays[CLUSTER.format(k) + n]) for n, _ in model.named_parameters()]
                           for k in range(len(self.cluster_initial))], self.device)
        weights = torch.as_tensor(list(u), dtype=towards.dtype, device=towards.device)
        params = list(model.parameters())

        def loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = self.criterion(m(x), y)
            return out + proximal(params, towards, weights, lam) if lam else out

        opt = self.optimizer(model, self.trained_parts, state)
        fit.loss = self.train(model, opt, data, seed, loss_fn=loss)
        fit.optimizer_state.update(opt.state_arrays())
        kept = self.client_state(fit)
        kept.arrays[U] = u
        return self.reply(fit), kept

    def personal_predictor(self, down, state):
        """Each client's own model (PCFedH's evaluation, pcfedh/pcfedh validators.py)."""
        return self.predictor(self.load(Record(), state))


__all__ = ["ClusterModels", "SoftClusterOptions", "SoftClustered", "cluster_initial", "importance"]
