"""FedPAC (Xu, Tong, Huang, "Personalized Federated Learning with Feature Alignment and Classifier
Collaboration", ICLR 2023; the authors' code: github.com/JianXu95/FedPAC @ 5770f4f, files
``methods/fedpac.py``, ``tools.py``, ``running.py``), as the FedAli authors ran it (getalp/FedAli fed_util.py,
``getalp/FedAli`` @ 65bb0c4, ``fed_util.py::fedPac_Trainer`` / ``get_head_agg_weight_optimized``).

The model is split into a feature extractor (``body``, averaged by the server) and a classifier
head that each client trains and that the server *combines* per client.

Client i, one round (getalp/FedAli fed_util.py):

1. **head step**: the body frozen, the head trains ``head_epochs`` (1) epochs with cross-entropy
   at ``head_lr_factor`` (10) x ``optimizer.lr`` (FedAli: Adam 1e-3 when the body uses 1e-4;
   the authors' code: SGD 0.1 against 0.01). It starts from the combined head the server sent
   (or, when there is none yet, from the head the client kept, else the initial one).
2. **body step** (feature alignment): the head frozen, the body trains ``local_epochs`` epochs on
   ``CE(head(z), y) + lamda * MSE(z, P̄[y])``, ``z = body(x)``, the MSE a mean over the batch and
   the feature dimensions (FedAli's ``reduce_mean(MSE)``, ``nn.MSELoss`` in the authors' code).
   ``P̄[j]`` is the global prototype of class j; for a class without one (every class in the
   first round; with partial participation, a class none of last round's clients had) it is the
   client's own class-j mean under the received body (eval mode), as FedAli's code does in its
   first round (no global prototypes yet) and the authors' code (``local_protos1``) for classes missing from the global
   prototypes. (The authors' code has no alignment term at all in its first round.)
3. **statistics** (after training, eval mode, the train split; FedAli's code): class means
   ``mu_j`` and counts ``n_j`` (the local prototypes), and the two statistics of the
   classifier-combination problem, with ``p_j = n_j / n``::

       h[j] = p_j * mu_j                                              ([Q, k])
       v    = (sum_j p_j * tr(E[z z^T | j]) - p_j^2 * ||mu_j||^2) / n   (a scalar)

   (:func:`feature_statistics`). ``h`` is the plug-in estimate of ``E[z e_y^T]`` (column j:
   ``p_j mu_j``) and ``v`` that of ``E||z e_y^T - h||_F^2 / n``, the variance of that sample
   mean (fedwear's reading of the codes' formula: a per-client variance over its sample
   count); both codes compute this biased (divide-by-n) plug-in estimator and so does fedwear. ``statistics: received`` computes
   ``h`` and ``v`` under the body as received, before the body step, as the authors' code does
   (``statistics_extraction`` runs before ``local_training``); the prototypes stay post-training
   in both (both codes).

The client replies with its body, its trained head, the prototypes and counts, ``h`` and ``v``.

Server (getalp/FedAli fed_util.py; the authors' ``running.py::train_round_fedpac``):

- body: the sample-weighted mean (FedAvg) of the round's bodies;
- global prototypes ``P̄``: per class the count-weighted mean of the round's class means
  (FedAli's ``fedPacProtoAgggregation``, the authors' ``protos_aggregation``), rebuilt from the
  round's replies (a class none of them had is masked out);
- heads: for each replying client i, weights ``alpha_i`` over the round's clients from the QP
  ``min alpha^T (diag(v) + D_i) alpha  s.t.  alpha >= 0, sum(alpha) = 1`` with
  ``D_i[j1, j2] = <h_i - h_j1, h_i - h_j2>`` over the flattened ``[Q, k]`` statistics ``h``
  (not head weights): a bias term ``||sum_j alpha_j (h_i - h_j)||^2`` plus a variance term
  ``sum_j alpha_j^2 v_j``, the codes' form of the paper's bias-variance estimate of client i's
  loss under the combined head. The matrix is rebuilt from its eigenvalues >= ``eig_clip``
  (0.01; smaller ones, including negative rounding errors, are dropped). FedAli's code does this
  every round (it keeps the original matrix only when the rebuilt one fails a numerical PSD
  check), the authors' code only when the matrix is not PSD; fedwear always does. The QP is solved by scipy's SLSQP from
  the uniform weights (both codes use cvxpy, which fedwear does not depend on); weights below
  ``alpha_floor`` (1e-3, both codes) are zeroed and the rest renormalised (as the authors'
  ``agg_classifier_weighted_p`` does; FedAli's code does not renormalise). Client i's next head
  is ``sum_j alpha_ij head_j`` (:func:`combination_weights`). If the solver returns no finite
  weights, the client keeps its own head (both codes' fallback).

Where fedwear decides:

- **Evaluation** (``evaluate_head``). getalp/FedAli fed_util.py measures personalisation *before* head
  aggregation, so by default a client is evaluated with the head it just trained (kept in its
  state) on the server's current body; the combined head is only where its next round starts.
  ``evaluate_head: combined`` evaluates with the combined head instead (what the authors' code
  tests at the start of the next round). FedAli's code evaluates the client's *own* body and
  head right after its training, before averaging: ``evaluation.personal_model: trained`` (set
  in the FedAli tables' configs), under which ``evaluate_head`` has no effect; otherwise the
  personal views use the server's body (as for FedPer and FedRep).
- **No global model**: heads are per client (``global_message`` is None; N/A in FedAli's tables).
- **New clients** (``adapt``): the global body with a head trained on their train split for
  ``evaluation.adapt_epochs`` epochs from the initial head, with the head step's objective and
  learning rate (as FedPer and FedRep adapt; neither paper has unseen clients).
- **Partial participation**: QP and combination run over the round's replies (as both codes,
  which train every client every round); a client's combined head stays on the server until
  its next round. The eigenvalue threshold is absolute: with features of small norm every
  eigenvalue can fall below 0.01, the matrix becomes 0 and the uniform start is the answer
  (every client gets the plain mean of the heads); lower ``eig_clip`` for such models.

The paper's equations could not be checked against its full text while writing this module;
the formulas above are the two codes' (which agree on ``h``, ``v``, ``D`` and the QP), and the
reading of ``v`` as the sample-mean variance is fedwear's derivation from them.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field
from threadpoolctl import threadpool_limits
from torch import nn

from fedwear.data.types import ClientData
from fedwear.evaluation.predictor import Predictor
from fedwear.methods import prototypes
from fedwear.methods.api import Options, Plan, Record, Task
from fedwear.methods.fedavg import FedAvg, tensors
from fedwear.methods.fit import Fit, Stage
from fedwear.methods.prototypes import COUNT, MASK, PROTO
from fedwear.methods.training import host, model_arrays, weighted_mean

#: The reply's feature statistics: ``h`` ([Q, k]) and ``v`` (float64 ``[1]``: Flower's arrays
#: carry no 0-d shape).
STAT_H, STAT_V = "pac_h", "pac_v"
#: Server-state prefix of client c's combined head: ``combined/<c>/head.<param>``.
COMBINED = "combined/"


class FedPACOptions(Options):
    lamda: float = Field(
        1.0, ge=0, description="weight of the feature-alignment MSE in the body step: 1.0 in FedAli's code "
        "(fedPacFit's lamda, getalp/FedAli fed_util.py) and the authors' (--lam 1.0)",
    )
    head_lr_factor: float = Field(
        10.0, gt=0, description="head-step learning rate = this x optimizer.lr: FedAli's Adam(clientLearningRate * 10) "
        "(getalp/FedAli fed_util.py), the authors' code 0.1 for a 0.01 body",
    )
    head_epochs: int = Field(
        1, ge=0, description="epochs of the head step per round: 1 in FedAli's code (fed_util.py) and the authors' "
        "(epoch_classifier = 1); the body step runs local_epochs",
    )
    eig_clip: float = Field(
        0.01, ge=0, description="eigenvalues of diag(v) + D below this are dropped before the QP (both codes: "
        "evals >= 0.01 kept); an absolute threshold",
    )
    alpha_floor: float = Field(
        1e-3, ge=0, lt=1, description="combination weights below this are zeroed, the rest renormalised (both "
        "codes: eps 1e-3)",
    )
    statistics: Literal["trained", "received"] = Field(
        "trained", description="h and v from the body after local training (FedAli's fed_util.py) or as "
        "received, before the body step (the authors' code)",
    )
    evaluate_head: Literal["trained", "combined"] = Field(
        "trained", description="personal views use the head the client just trained (FedAli's fed_util.py: measured before "
        "head aggregation) or the server's combined head (the authors' code, next round's start)",
    )


# ---- statistics and the QP (pure functions, tested on their own) --------------------------------
def feature_statistics(z: torch.Tensor, y: torch.Tensor, num_classes: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Class means ``[Q, k]`` (float32; zero rows for absent classes), counts ``[Q]`` (float32),
    ``h = p_j * mu_j`` ``[Q, k]`` (float32) and ``v`` (float64 ``[1]``) of features ``z`` ``[N, k]``
    with labels ``y`` (see the module docstring; FedAli's and the authors' estimator), on the
    host; computed on ``z``'s device."""
    z, y = z.detach().double(), y.to(z.device)
    n = len(y)
    counts = torch.bincount(y, minlength=num_classes).double()
    safe = counts.clamp(min=1)
    means = torch.zeros(num_classes, z.shape[1], dtype=torch.float64, device=z.device).index_add_(0, y, z) / safe[:, None]
    second = torch.zeros(num_classes, dtype=torch.float64, device=z.device).index_add_(0, y, (z * z).sum(1)) / safe  # tr E[zz^T|j]
    p = counts / max(n, 1)
    h = p[:, None] * means
    v = float((p * second - p**2 * (means * means).sum(1)).sum()) / max(n, 1)
    return (host(means.float()), host(counts.float()), host(h.float()), np.array([v], np.float64))


def clip_eigenvalues(matrix: np.ndarray, clip: float) -> np.ndarray:
    """``matrix`` (symmetrised) rebuilt from its eigenpairs with eigenvalue >= ``clip``; the others
    are dropped (both codes' "numerical stability" step), so the result is positive semi-definite."""
    sym = (matrix + matrix.T) / 2
    vals, vecs = np.linalg.eigh(sym)
    kept = np.where(vals >= clip, vals, 0.0)
    out = (vecs * kept) @ vecs.T
    return (out + out.T) / 2


def simplex_qp(matrix: np.ndarray) -> np.ndarray | None:
    """``argmin a^T M a`` over the probability simplex by scipy's SLSQP from the uniform weights
    (``M`` scaled to max |entry| 1 first: same minimiser, scale-free tolerances); None when the
    solver gives no finite answer. A zero matrix returns the uniform weights."""
    m = len(matrix)
    scale = float(np.abs(matrix).max()) if m else 0.0
    start = np.full(m, 1.0 / m)
    if not np.isfinite(scale):
        return None
    if scale == 0.0:
        return start
    from scipy.optimize import minimize  # imported here: it slows every start-up

    q = matrix / scale
    res = minimize(
        lambda a: float(a @ q @ a), start, jac=lambda a: 2.0 * (q @ a), method="SLSQP",
        bounds=[(0.0, 1.0)] * m,
        constraints=[{"type": "eq", "fun": lambda a: float(a.sum() - 1.0), "jac": lambda a: np.ones_like(a)}],
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    a = np.clip(np.asarray(res.x, np.float64), 0.0, None)
    if not np.isfinite(a).all() or a.sum() <= 0:
        return None
    return a / a.sum()


def combination_weights(h: np.ndarray, v: np.ndarray, eig_clip: float = 0.01, floor: float = 1e-3
                        ) -> np.ndarray:
    """Row i: client i's head-combination weights over the m clients, from their flattened
    statistics ``h`` ``[m, Q*k]`` and variances ``v`` ``[m]`` (module docstring): the QP on
    ``clip_eigenvalues(diag(v) + D_i)``, weights < ``floor`` zeroed, renormalised; client i's own
    head alone when the solver fails.

    ``D_i[j1, j2] = <h_i - h_j1, h_i - h_j2> = G_ii - G_ij1 - G_ij2 + G_j1j2`` from one Gram matrix
    ``G`` of the (client-mean centred) statistics: O(m^2 Qk) instead of O(m^3 Qk). BLAS runs on
    one thread here: bit-identical on every run and engine, and no thread contention on a busy
    machine (141 clients: about 1 s of eigendecompositions and 10 s of SLSQP on one core).
    """
    h = np.asarray(h, np.float64).reshape(len(h), -1)
    v = np.asarray(v, np.float64)
    m = len(v)
    out = np.zeros((m, m))
    with threadpool_limits(limits=1):
        centred = h - h.mean(0)
        gram = centred @ centred.T
        for i in range(m):
            bias = gram[i, i] - gram[i][:, None] - gram[i][None, :] + gram
            alpha = simplex_qp(clip_eigenvalues(np.diag(v) + bias, eig_clip))
            if alpha is not None:
                alpha = np.where(alpha < floor, 0.0, alpha)
            if alpha is None or alpha.sum() <= 0:
                alpha = np.eye(m)[i]
            out[i] = alpha / alpha.sum()
    return out


# ---- the method ---------------------------------------------------------------------------------
class FedPAC(FedAvg):
    name = "fedpac"
    same_model_for_all = False  # its own configure: not FedAvg's one global model for every client
    summary = ("FedPAC (Xu et al. 2023): head step, then the body with feature alignment to global prototypes; "
               "bodies averaged, each client's head a QP-weighted combination of the round's heads.")
    kinds = ("classification",)  # class prototypes and per-class statistics
    Options = FedPACOptions
    shared = ("body",)
    personal = ("head",)
    mean_aggregation = False  # per-client head combinations from individual statistics

    def __init__(self, task: Task, options: FedPACOptions) -> None:
        super().__init__(task, options)
        with torch.no_grad():
            probe = torch.zeros(2, task.window, task.channels, device=self.device)
            self.dim = int(self.model.eval().features(probe).shape[1])
        self.model.train()
        self.body_keys = [k for k in self.initial if k.startswith("body.")]
        self.head_keys = [k for k in self.initial if k.startswith("head.")]

    # ---- server -------------------------------------------------------------------------------
    def init_server(self) -> Record:
        q = self.task.num_classes
        return Record({**super().init_server().arrays, PROTO: np.zeros((q, self.dim), np.float32),
                       MASK: np.zeros(q, np.float32)})

    def combined_head(self, server: Record, client: str) -> dict[str, np.ndarray]:
        """Client ``client``'s combined head as ``head.*`` arrays (empty before its first round)."""
        prefix = f"{COMBINED}{client}/"
        return {k[len(prefix):]: a for k, a in server.arrays.items() if k.startswith(prefix)}

    def configure(self, server: Record, client: str, round: int) -> Record:
        """The body, the global prototypes and mask, and this client's own combined head."""
        common = {k: a for k, a in server.arrays.items() if not k.startswith(COMBINED)}
        return Record({**common, **self.combined_head(server, client)})

    def evaluation_message(self, server: Record, client: str, round: int) -> Record:
        """The body; with ``evaluate_head: combined`` also the client's combined head."""
        arrays = {k: server.arrays[k] for k in self.body_keys}
        if self.options.evaluate_head == "combined":
            arrays.update(self.combined_head(server, client))
        return Record(arrays)

    def aggregate(self, server: Record, replies: dict[str, Record], round: int, plan: Plan | None = None) -> Record:
        """Body: FedAvg; prototypes: count-weighted per class; heads: per client, the QP-weighted
        combination of the round's heads (clients in sorted order: engine-independent sums)."""
        if not replies:
            return server
        ids = sorted(replies)
        rs = [replies[c] for c in ids]
        arrays = {k: a for k, a in server.arrays.items() if k.startswith(COMBINED)}  # absent clients keep theirs
        arrays.update(weighted_mean(rs, self.body_keys))
        proto, mask = prototypes.aggregate(rs, weighted=True)
        arrays.update({PROTO: proto, MASK: mask})
        h = np.stack([r.arrays[STAT_H].astype(np.float64).ravel() for r in rs])
        v = np.array([float(r.arrays[STAT_V][0]) for r in rs])
        alpha = combination_weights(h, v, self.options.eig_clip, self.options.alpha_floor)
        for name in self.head_keys:
            heads = np.stack([r.arrays[name].astype(np.float64) for r in rs])
            for i, c in enumerate(ids):
                combined = np.tensordot(alpha[i], heads, axes=1)
                arrays[f"{COMBINED}{c}/{name}"] = combined.astype(rs[i].arrays[name].dtype)
        return Record(arrays, dict(server.scalars))

    def reply_spec(self, down: Record) -> dict[str, tuple[int, ...] | None]:
        q = self.task.num_classes
        spec = {k: self.initial[k].shape for k in self.body_keys + self.head_keys}
        return {**spec, PROTO: (q, self.dim), COUNT: (q,), STAT_H: (q, self.dim), STAT_V: (1,)}

    def global_message(self, server: Record) -> Record | None:
        """None: every client has its own head (FedAli's tables: N/A)."""
        return None

    # ---- client -------------------------------------------------------------------------------
    def head_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, fit: Fit | None) -> torch.Tensor:
        """The head step's objective: cross-entropy (both codes)."""
        return self.criterion(model(x), y)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, fit: Fit | None) -> torch.Tensor:
        """The body step's objective: ``CE(head(z), y) + lamda * MSE(z, P̄[y])`` (module docstring)."""
        z = model.features(x)
        ce = self.criterion(model.head(z), y)
        if fit is None or "targets" not in fit.inputs:
            return ce
        target = prototypes.targets(z, y, fit.inputs["targets"], fit.inputs["target_mask"])
        return ce + self.options.lamda * prototypes.distance(z, target, "l2")

    def embed(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Features of ``x`` in eval mode, without gradients, in batches of ``evaluation.batch_size``
        (FedAli's ``predict``: Keras' batch of 32 in its configs, which matters with ``liteformer:
        code``, whose outputs depend on the batch's other windows)."""
        was = model.training
        model.eval()
        step = self.task.training.eval_batch_size
        with torch.no_grad():
            z = torch.cat([model.features(x[i : i + step]) for i in range(0, len(x), step)])
        model.train(was)
        return z

    def prepare(self, fit):
        """The client's model: the server's body and combined head (which wins over the head
        the client kept)."""
        fit.model = self.load(Record({**fit.state.arrays, **fit.down.arrays}), Record())

    def local_update(self, fit):
        """Steps 1 and 2: the head on the frozen body, then the body on the frozen head, aligned
        with the global prototypes."""
        o, q = self.options, self.task.num_classes
        x, y = tensors(fit.data)  # the host's (for the class bookkeeping below) and the device's copy
        xd, yd = x.to(self.device), y.to(self.device)
        self.run_stage(fit, Stage("head", ("head",), self.head_loss, o.head_epochs,
                                  lr=o.head_lr_factor * self.task.training.optimizer.lr))
        glob = torch.from_numpy(fit.down.arrays[PROTO]).float()
        mask = torch.from_numpy(fit.down.arrays[MASK]).bool()
        present = torch.bincount(y, minlength=q) > 0
        received = None
        if o.statistics == "received" or bool((present & ~mask).any()):
            received = feature_statistics(self.embed(fit.model, xd), yd, q)  # the body as received
            glob = torch.where(mask[:, None], glob, torch.from_numpy(received[0]))
        fit.notes["received"] = received
        fit.inputs.update(targets=glob.to(self.device), target_mask=(mask | present).float().to(self.device))
        self.run_stage(fit, Stage("body", ("body",), self.loss, self.local_epochs, seed="body"))

    def reply(self, fit):
        """Step 3: both parts, and the feature statistics of the trained body (those of the
        received one with ``statistics: received``)."""
        x, y = (t.to(self.device) for t in tensors(fit.data))
        means, counts, h, v = feature_statistics(self.embed(fit.model, x), y, self.task.num_classes)
        if self.options.statistics == "received":
            _, _, h, v = fit.notes["received"]
        return Record({**model_arrays(fit.model, ("body", "head")), PROTO: means, COUNT: counts, STAT_H: h, STAT_V: v},
                      {"num_examples": len(fit.data.train), "loss": fit.loss})

    def personal_predictor(self, down: Record, state: Record) -> Predictor | None:
        """The server's body with the client's just-trained head (default), or with its combined
        head when ``evaluate_head: combined`` and the message carries one."""
        if self.options.evaluate_head == "combined":
            return self.predictor(self.load(Record({**state.arrays, **down.arrays}), Record()))
        return super().personal_predictor(down, state)

    def adapt(self, down: Record, data: ClientData, seed: int) -> Record:
        """A new client trains a head on the global body for ``evaluation.adapt_epochs`` epochs
        with the head step's objective and learning rate (as FedPer / FedRep)."""
        lr = self.options.head_lr_factor * self.task.training.optimizer.lr
        return self.train_personal(Record({k: down.arrays[k] for k in self.body_keys}), data, seed,
                                   self.personal, self.head_loss, lr)


__all__ = ["FedPAC", "FedPACOptions", "clip_eigenvalues", "combination_weights", "feature_statistics",
           "simplex_qp"]
