"""FedAli (Ek, Wang, Portet, Lalanda, Cao, "FedAli: Personalized Federated Learning with Aligned
Prototypes through Optimal Transport", 2024; Algorithm 1; getalp/FedAli).

FedAvg on HART with ALP layers (``models/hart.py``, ``models/alp.py``): clients train the
whole model (the ALP layers align tokens to the global prototypes and move their local
prototypes by EMA inside the forward pass); the server

1. averages **every** array weighted by train windows (Eq. 1), prototypes included;
2. per block l: clusters the concatenation of the clients' local prototypes (C x G_l x d) with
   scikit-learn ``KMeans(n_clusters=G_l, init=<their weighted mean>, n_init=1, max_iter=300,
   tol=1e-4)`` (Algorithm 1 lines 9-11; sklearn's defaults as the code ran them) and takes the
   mean of each final cluster (the code's ``cluster_means``; a cluster left empty keeps its
   centroid, where the code would have crashed);
3. sets the global **and** the local prototypes to those means (the local reset of Sec. 4; the
   code's ``usePersonalPrototype=False``), so the global model (global view) matches tokens to
   them at inference (getalp/FedAli).

beta (the ALP's ``beta`` buffers, sent with the weights) is ``first_round_beta`` in fedwear's
round 1, the authors' round 0 (their ``main.py`` trains round 0 with influenceFactor 0.0, which
the paper does not say; fedwear's rounds count from 1, ``engines/runner.py``), and the model's
``alp.beta`` afterwards; the server's own model (``global_message``) always holds the model's
beta, as the code's server model was built with it.

The code evaluates each client right after its local training (getalp/FedAli), with its own
updated local prototypes: ``evaluation.personal_model: trained``, a setting of the protocol that
applies to every method (``configs/fedali/``). With ``personal_prototypes`` a client keeps its
local prototypes and starts each round from them instead of the server's (the code's
``usePersonalPrototype=True``).

The model must be ``hart`` (its ``alp`` options, or the ALP defaults when they are absent).
Training defaults of the paper and the code (getalp/FedAli main.py) are config keys, not options: Adam lr
1e-4 (Keras' eps 1e-7; torch's Adam uses 1e-8), 5 local epochs, batch 64, all clients every
round, no gradient clipping, and evaluation batch 32 for ``liteformer: code``.

k-means runs on one thread (``threadpoolctl``): scikit-learn's multi-threaded Lloyd sums
per-thread partial centres in arrival order, which is not bit-reproducible.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from pydantic import Field

from fedwear.errors import ConfigError
from fedwear.methods.api import Options, Record, Task
from fedwear.methods.fedavg import PARTS, FedAvg
from fedwear.methods.training import load_arrays, model_arrays, weighted_mean
from fedwear.models import SplitModel, build_model
from fedwear.models.alp import ALP
from fedwear.seeding import derive_seed

#: Prefix of the client's own local prototypes in its state (``personal_prototypes``).
OWN = "own."
LOCAL, GLOBAL, BETA = "local_prototypes", "global_prototypes", "beta"


class FedAliOptions(Options):
    first_round_beta: float | None = Field(
        0.0, ge=0, le=1, description="beta of fedwear's round 1 (the code's round 0): 0.0 as the code's main.py "
        "(getalp/FedAli); null: model.options.alp.beta from the start (the paper)",
    )
    personal_prototypes: bool = Field(
        False, description="clients start each round from their own local prototypes instead of the server's "
        "k-means ones (the code's usePersonalPrototype; default False as the code and Sec. 4)",
    )
    kmeans_max_iter: int = Field(300, ge=1, description="KMeans max_iter (scikit-learn's default, as the code ran it)")
    kmeans_tol: float = Field(1e-4, ge=0, description="KMeans tol, relative to the data's mean variance (sklearn's default)")


def kmeans_prototypes(points: np.ndarray, init: np.ndarray, max_iter: int = 300, tol: float = 1e-4,
                      seed: int = 0) -> np.ndarray:
    """As getalp/FedAli's server (sklearn KMeans, n_init=1): Lloyd k-means of ``points`` (n x d) from the centres ``init`` (G x d), then
    the mean of the points of each final cluster (float32). A cluster with no point keeps its
    k-means centre. One thread: bit-identical on every run and engine."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning
    from threadpoolctl import threadpool_limits

    x = np.ascontiguousarray(points, dtype=np.float32)
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # duplicate points: fewer distinct clusters
        km = KMeans(n_clusters=len(init), init=np.asarray(init, np.float32), n_init=1, max_iter=max_iter, tol=tol,
                    random_state=seed % 2**32).fit(x)
    labels = torch.from_numpy(km.labels_.astype(np.int64))
    sums = torch.zeros(len(init), x.shape[1], dtype=torch.float64).index_add_(0, labels, torch.from_numpy(x).double())
    counts = torch.bincount(labels, minlength=len(init))
    out = torch.from_numpy(km.cluster_centers_.astype(np.float64))
    hit = counts > 0
    out[hit] = sums[hit] / counts[hit, None]
    return out.float().numpy()


class FedAli(FedAvg):
    name = "fedali"
    same_model_for_all = False  # its own configure: not FedAvg's one global model for every client
    summary = ("FedAli (Ek et al. 2024): FedAvg on HART with ALP layers; the server k-means the clients' "
               "local prototypes per block into the next round's global and local prototypes.")
    Options = FedAliOptions
    mean_aggregation = False  # prototypes come from k-means, not a mean
    no_dp_reason = "its global prototypes are k-means centroids of every client's own prototypes, not a mean"

    def __init__(self, task: Task, options: Options) -> None:
        super().__init__(task, options)
        layers = self.model.alp_layers()
        self.layers: dict[str, ALP] = layers
        self.beta = float(next(iter(layers.values())).beta)
        self.beta_keys = [f"{p}.{BETA}" for p in layers]
        self.local_keys = {p: f"{p}.{LOCAL}" for p, m in layers.items() if m.use_local}
        self.global_keys = {p: f"{p}.{GLOBAL}" for p, m in layers.items() if m.use_global}

    def new_model(self) -> SplitModel:
        """HART with ALP layers from the config's ``hart`` options (the ALP defaults when it has
        none), initialised from the run seed."""
        cfg = self.task.training
        if cfg.model != "hart":
            raise ConfigError(f"method=fedali needs model.name=hart (its ALP layers live in HART's blocks); "
                              f"got model.name={cfg.model}")
        options = dict(cfg.model_options)
        if options.get("alp") is False:
            raise ConfigError("method=fedali needs HART's ALP layers: remove model.options.alp=false")
        options["alp"] = options.get("alp") or {}
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            return build_model("hart", self.task.window, self.task.channels, self.task.num_outputs,
                               **options).to(self.device)

    # ---- server ---------------------------------------------------------------------------
    def round_beta(self, round: int) -> float:
        """beta clients train and are evaluated with in ``round`` (1-based; round 0 is
        ``evaluation.at_start``): ``first_round_beta`` up to round 1, then the model's."""
        first = self.options.first_round_beta
        return first if round <= 1 and first is not None else self.beta

    def configure(self, server: Record, client: str, round: int) -> Record:
        """The server's weights with this round's beta in every ALP layer."""
        beta = np.full(1, self.round_beta(round), np.float32)
        return Record({**server.arrays, **{k: beta.copy() for k in self.beta_keys}})

    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan=None) -> Record:
        """Weighted mean of every array (Eq. 1), then per block k-means of the clients' local
        prototypes into the global and local prototypes (Algorithm 1; getalp/FedAli)."""
        if not replies:
            return server
        reps = [replies[c] for c in sorted(replies)]
        keys = [k for k in server.arrays if k in reps[0].arrays]
        new = weighted_mean(reps, keys)
        o = self.options
        seed = derive_seed(self.task.training.seed, "fedali-kmeans", round)
        for prefix, key in self.local_keys.items():
            points = np.concatenate([r.arrays[key] for r in reps])
            protos = kmeans_prototypes(points, new[key], o.kmeans_max_iter, o.kmeans_tol, seed)
            new[key] = protos
            if prefix in self.global_keys:
                new[self.global_keys[prefix]] = protos.copy()
        new.update({k: np.full(1, self.beta, np.float32) for k in self.beta_keys})
        return Record({**server.arrays, **new}, dict(server.scalars))

    # ---- client ---------------------------------------------------------------------------
    def prepare(self, fit):
        """With ``personal_prototypes``, the client's own local prototypes replace the server's."""
        super().prepare(fit)
        if self.options.personal_prototypes:
            own = {k: fit.state.arrays[OWN + k] for k in self.local_keys.values() if OWN + k in fit.state.arrays}
            load_arrays(fit.model, own)

    def client_state(self, fit):
        """FedAvg's, plus (``personal_prototypes``) the local prototypes under ``own.``."""
        state = super().client_state(fit)
        if self.options.personal_prototypes:
            mine = model_arrays(fit.model, PARTS)
            state.arrays.update({OWN + k: mine[k] for k in self.local_keys.values()})
        return state


__all__ = ["FedAli", "kmeans_prototypes"]
