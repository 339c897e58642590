"""FedCE (Cai, Chen, Cao et al., "FedCE: Personalized Federated Learning Method based on
Clustering Ensembles", ACM Multimedia 2023, p. 1625-1633, doi:10.1145/3581783.3612217): a PCFedH
Table 2 baseline.

**No code of FedCE is public**, and the paper's own text was not
available either: searches of stored web pages, documentation, issue threads and source code for
its title, DOI and authors found nothing beyond the citation. Its section and equation numbers
therefore cannot be cited. What follows is reconstructed from these sources, tagged below:

* [P-2.2] PCFedH (Yin et al., FITEE 2025), section 2.2, the FedCE paragraph: FedCE is "based on
  the concept of soft clustering for personalized training"; it was introduced "to address the
  high computational costs brought by model inference through all training data" (FedSoft's
  per-window cluster counts); it "uses the loss observed across multiple batches to represent
  the features of client data distributions, sidestepping the need to specify exact data
  proportions"; and it "presumes that each client predominantly belongs to a single class".
* [P-T1] PCFedH section 3.5, Table 1: FedCE's client time per epoch is O(BKd log K) (B data
  size, K clusters, d model size): every cluster model is evaluated, plus a sort over K.
* [P-5.2] PCFedH section 5.2.1, conclusion 1: the methods with regularised local updates are
  FedSoft, FedProx and PCFedH; FedCE is not among them, so its local update overwrites.
* [S] FedCE's title ("... based on Clustering Ensembles") read with [P-2.2]: a soft clustering
  ensemble over the losses of several batches as client distribution features.
* [CN] Patent CN116522184B (Beijing Jiaotong University, filed 2023-03-29, "federated learning
  method and system based on data distribution similarity fuzzy clustering"); only its abstract
  was found: all cluster models are broadcast; a client computes the cluster models' losses,
  selects N clusters as its associated clusters from them and evaluates their importance; the
  client model is initialised and trained locally; the cluster models are aggregated with weights
  from the client's sample size and its association degree with each cluster. That it describes
  FedCE is **not confirmed** (the same year and, as far as known, the authors' institution); it
  is used only where PCFedH is silent.

One round, as implemented (I = inferred, not stated by any source above):

1. Server state: K cluster models ``cluster{k}.<param>`` from K independent initialisations
   (:func:`fedwear.methods.soft_clustering.cluster_initial`, as IFCA and FedSoft here; I: no
   source describes FedCE's initialisation). The round's clients are the run's schedule (I; the
   PCFedH configs run every baseline with every client every round). Each receives all K models
   [CN].
2. Distribution feature [P-2.2, S] (:meth:`FedCE.batch_losses`): ``L_i[b, k]``, the task's loss
   (cross-entropy or MSE, ``criterion``) of cluster model k on batch b, for ``feature_batches``
   batches of ``batch_size`` train windows drawn without replacement
   (``derive_seed(seed, "fedce.batches")``); a client with fewer windows uses the batches it has.
   Only these S batches are run through the K models, not all training data [P-2.2].
3. Clustering ensemble [S] (:func:`ensemble_memberships`): each batch is one base clustering
   that assigns the client to its ``associated`` lowest-loss clusters (ranking the K losses: the
   log K of [P-T1]; N associated clusters: [CN]). All base clusterings label the same K cluster
   models, so their consensus needs no label matching; the consensus function is voting, kept
   soft: ``u_ik = (1 / S) sum_b [k in top_N(L_i[b])] / N`` (I: the voting rule), a soft
   membership summing to 1 [P-2.2]. ``associated = 1`` makes each batch vote for one cluster, so
   a client whose batches agree belongs to one cluster, as [P-2.2] says FedCE presumes.
4. Local update: the client's model starts as the membership-weighted combination of the
   cluster models ``sum_k u_ik w_k`` ([CN]: "the client model is initialised"; the combination is
   I) and is trained for ``local_epochs`` on the task's loss alone, without a proximal term
   [P-5.2]. It replies its model and ``u_i`` (array ``membership``).
5. Aggregation [CN] (:meth:`FedCE.aggregate`): ``w_k = sum_i n_i u_ik w_i / sum_i n_i u_ik`` over
   the round's replies (``n_i``: train windows); a cluster no reply is associated with keeps its
   model.

Evaluation (I): a client's personal model is ``sum_k u_ik w_k``, ``u_i`` estimated as in steps
2-3 from its train split at evaluation time (``personalize``), the model its local training
would start from; a new client does the same (``adapt``, no training). There is no single global
model (``global_message`` is None). A client keeps nothing between rounds except the optimiser
state when ``optimizer.persist``.

Defaults: ``clusters=4`` is PCFedH's K for PPG-DaLiA (pcfedh/pcfedh main.py; 5 for distracted driving), as
FedCE's own K is unknown; ``feature_batches=5`` (I: [P-2.2] and [S] say "multiple" / "several"
batches, no number); ``associated=1`` (I: [P-2.2]'s single dominant cluster; [CN]'s N is "a
parameter determined in advance according to the number of clusters and the number of
clients", no value).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field, ValidationInfo, field_validator

from fedwear.data.types import ClientData
from fedwear.evaluation.predictor import Predictor
from fedwear.methods.api import Options, Plan, Record, Task
from fedwear.methods.fedavg import tensors
from fedwear.methods.soft_clustering import CLUSTER, ClusterModels
from fedwear.methods.training import host, load_arrays
from fedwear.models import SplitModel
from fedwear.seeding import derive_seed

#: Array of a reply (and of a personalized state): the client's soft memberships ``u_i``, ``[K]``.
MEMBERSHIP = "membership"


class FedCEOptions(Options):
    clusters: int = Field(
        4, ge=1,
        description="K cluster models on the server (FedCE's own K is unknown: PCFedH's code uses 4 for PPG-DaLiA, "
        "5 for distracted driving; pcfedh/pcfedh main.py)",
    )
    feature_batches: int = Field(
        5, ge=1,
        description="S, train batches (of batch_size windows) whose losses under the K cluster models form a "
        "client's distribution feature (PCFedH section 2.2: 'loss observed across multiple batches'; the number "
        "is not given anywhere: inferred)",
    )
    associated: int = Field(
        1, ge=1,
        description="N, lowest-loss clusters each batch votes for in the clustering ensemble (inferred: PCFedH "
        "section 2.2, FedCE presumes one dominant cluster per client; N associated clusters as in patent "
        "CN116522184B, value not given)",
    )

    @field_validator("associated")
    @classmethod
    def _at_most_clusters(cls, value: int, info: ValidationInfo) -> int:
        clusters = info.data.get("clusters")
        if clusters is not None and value > clusters:
            raise ValueError(f"must not exceed clusters ({clusters})")
        return value


def ensemble_memberships(losses: np.ndarray, associated: int = 1) -> np.ndarray:
    """Soft memberships ``u [K]`` from a distribution feature ``losses [S, K]``: each row (batch)
    votes ``1 / N`` for each of its ``N = associated`` lowest-loss clusters (ties: the lower k),
    and ``u`` is the mean vote over the rows (step 3 of the module docstring)."""
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 2 or not len(losses):
        raise ValueError(f"losses must be [batches, clusters] with at least one batch, got shape {losses.shape}")
    n = min(associated, losses.shape[1])
    votes = np.zeros_like(losses)
    top = np.argsort(losses, axis=1, kind="stable")[:, :n]
    np.put_along_axis(votes, top, 1.0 / n, axis=1)
    return votes.mean(axis=0)


def combine(models: list[dict[str, np.ndarray]], weights: np.ndarray) -> dict[str, np.ndarray]:
    """``sum_k weights[k] models[k] / sum_k weights[k]`` per array, accumulated in float64 and
    returned in each array's dtype (integer buffers rounded); models of weight 0 are skipped."""
    w = np.asarray(weights, dtype=np.float64)
    total = float(w.sum())
    if not total > 0:
        raise ValueError("combine needs a positive total weight")
    used = [(wk / total, m) for wk, m in zip(w, models, strict=True) if wk > 0]
    out = {}
    for name, ref in models[0].items():
        acc = sum(wk * np.asarray(m[name], dtype=np.float64) for wk, m in used)
        out[name] = (np.rint(acc) if ref.dtype.kind in "iub" else acc).astype(ref.dtype)
    return out


class FedCE(ClusterModels):
    name = "fedce"
    summary = ("FedCE (Cai et al. 2023), reconstructed: losses of K cluster models on a few batches vote for "
               "soft memberships; clients start from the membership mix, the server averages per cluster.")
    Options = FedCEOptions

    def __init__(self, task: Task, options: FedCEOptions) -> None:
        super().__init__(task, options)
        self.opt: FedCEOptions = options

    # ---- server -------------------------------------------------------------------------
    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        """Cluster k := the mean of the replied models weighted by ``n_i u_ik``; a cluster with no
        weight this round keeps its model (step 5)."""
        arrays = dict(server.arrays)
        got = list(replies.values())
        if not got:
            return Record(arrays, dict(server.scalars))
        models = [{n: r.arrays[n] for n in self.initial} for r in got]
        weight = np.stack([float(r.scalars["num_examples"]) * np.asarray(r.arrays[MEMBERSHIP], np.float64)
                           for r in got])  # [clients, K]
        for k in range(self.opt.clusters):
            if weight[:, k].sum() > 0:
                arrays.update({CLUSTER.format(k) + n: a for n, a in combine(models, weight[:, k]).items()})
        return Record(arrays, dict(server.scalars))

    def global_message(self, server: Record) -> Record | None:
        return None

    def reply_spec(self, down: Record) -> dict[str, tuple[int, ...] | None]:
        """One model (the client's, trained) and its memberships."""
        return {**{n: a.shape for n, a in self.initial.items()}, MEMBERSHIP: (self.opt.clusters,)}

    def validate_reply(self, down: Record, reply: Record) -> str | None:
        why = super().validate_reply(down, reply)
        if why is not None:
            return why
        u = reply.arrays[MEMBERSHIP]
        if u.dtype.kind != "f" or (u < 0).any() or abs(float(u.sum()) - 1.0) > 1e-6:
            return f"array {MEMBERSHIP!r} is not a distribution over the {self.opt.clusters} clusters"
        return None

    # ---- client -------------------------------------------------------------------------
    def cluster_models(self, down: Record) -> list[dict[str, np.ndarray]]:
        return [{n: down.arrays[CLUSTER.format(k) + n] for n in self.initial} for k in range(self.opt.clusters)]

    @torch.no_grad()
    def batch_losses(self, down: Record, data: ClientData, seed: int) -> np.ndarray:
        """The distribution feature ``L [S, K]``: the task's loss of each cluster model on each of
        ``feature_batches`` train batches drawn without replacement (step 2)."""
        x, y = tensors(data)
        n, bs = len(y), self.batch_size
        if n == 0:
            raise ValueError(f"client {data.client_id!r} has no train windows")
        order = torch.from_numpy(np.random.default_rng(derive_seed(seed, "fedce.batches")).permutation(n))
        batches = min(self.opt.feature_batches, -(-n // bs))
        idx = order[:batches * bs]
        xs, ys = x[idx].to(self.device), y[idx].to(self.device)  # the drawn windows only
        losses = []
        for arrays in self.cluster_models(down):
            model = self.loaded(arrays)
            model.eval()
            pred = model(xs)
            losses.append(torch.stack([self.criterion(pred[b * bs:(b + 1) * bs], ys[b * bs:(b + 1) * bs])
                                       for b in range(batches)]))
        return host(torch.stack(losses, dim=1)).astype(np.float64)  # [S, K]: one copy to the host

    def memberships(self, down: Record, data: ClientData, seed: int) -> np.ndarray:
        """``u_i`` (steps 2-3)."""
        return ensemble_memberships(self.batch_losses(down, data, seed), self.opt.associated)

    def loaded(self, arrays: dict[str, np.ndarray]) -> SplitModel:
        """The method's one model object holding ``arrays``."""
        load_arrays(self.model, {**self.initial, **arrays})
        return self.model

    def mixed(self, down: Record, u: np.ndarray) -> SplitModel:
        """The model ``sum_k u_k w_k`` (step 4; the personal model at evaluation)."""
        return self.loaded(combine(self.cluster_models(down), u))

    def prepare(self, fit):
        """The client's membership mix of the cluster models (steps 2-4)."""
        fit.notes["membership"] = self.memberships(fit.down, fit.data, fit.seed)
        fit.model = self.mixed(fit.down, fit.notes["membership"])

    def reply(self, fit):
        up = super().reply(fit)
        up.arrays[MEMBERSHIP] = fit.notes["membership"]
        return up

    # ---- evaluation ---------------------------------------------------------------------
    def personalize(self, down: Record, state: Record, data: ClientData, seed: int) -> Record:
        """The client's state plus its memberships estimated now from its train split."""
        return Record({**state.arrays, MEMBERSHIP: self.memberships(down, data, seed)}, dict(state.scalars))

    def adapt(self, down: Record, data: ClientData, seed: int) -> Record:
        """A new client estimates its memberships as a training client does (no training)."""
        return Record({MEMBERSHIP: self.memberships(down, data, seed)})

    def personal_predictor(self, down: Record, state: Record) -> Predictor | None:
        """The membership mix of the cluster models (None before memberships were estimated)."""
        u = state.arrays.get(MEMBERSHIP)
        return None if u is None else self.predictor(self.mixed(down, u))


__all__ = ["FedCE", "FedCEOptions", "combine", "ensemble_memberships"]
