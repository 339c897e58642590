"""The ALP layer (ALignment with Prototypes) of FedAli (Ek et al. 2024, Sec. 3.1; getalp/FedAli alp_model.py).

Per transformer block, a set of *local* and a set of *global* prototypes (G x d each,
buffers, not parameters: no gradient ever reaches them) and a GLU. For tokens ``x`` of shape
``(B, Z, d)``, flattened to ``X`` (``N = B*Z`` rows):

- training: ``P = [P_loc; P_glob]`` (paper Eq. 3); a transport plan ``Q`` between ``X`` and
  ``P`` (Sinkhorn-Knopp on the cosine matrix, Eq. 4); every token takes its best *global*
  prototype ``M``; the local prototypes follow the tokens by EMA (Eq. 5), inside the forward
  pass without gradients (as the authors' Keras layer does);
- inference: ``P = P_loc``; every token takes its best local prototype ``M``;

then ``out = beta * GLU(sg(M)) + (1 - beta) * X`` (Eq. 6-7), L2-normalised per token.

Code-faithful details (``alp_model.py::AlignmentWithProtoype`` at getalp/FedAli@65bb0c4):

- Sinkhorn: float32, ``eps = 0.05``, 3 iterations of row then column normalisation, the
  last operation a column normalisation (:func:`sinkhorn`);
- ``update: single`` (the default: the only update the from-scratch FedAli path runs: its
  ``HART_ALP`` does not pass ``singleUpdate`` on): each token's best local prototype ``a`` becomes ``gamma * P_loc[a] + (1 - gamma) * X``
  with the *raw* token (not normalised). Where several tokens pick the same prototype the
  Keras scatter keeps an arbitrary one; here the **last token in (sample, token) order wins**
  (:func:`single_update`), deterministic on every engine;
- ``update: soft_code``: every local prototype moves towards the plan-weighted mean of its
  top ``k = max(B // G, 1)`` tokens (``B`` the batch size, raw tokens: the code's soft path);
  ``soft_paper``: ``k = ceil(B*Z / G)`` and L2-normalised tokens (the paper's text);
- l2 normalisation as TensorFlow's: ``x / sqrt(max(sum x^2, 1e-12))``.

``beta`` is a one-element buffer (shape ``(1,)``) (``<prefix>.beta`` in the state dict), so a method can set it
per round through the weights it sends (FedAli: 0 in its first round, getalp/FedAli) and a
checkpoint or a client's kept model carries it.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from fedwear.models.base import ModelOptions

#: Sinkhorn regularisation and iterations, hard-coded in the authors' layer (``alp_model.py``; paper
#: Sec. 3.1 after SwAV, Caron et al. 2020).
SINKHORN_EPS = 0.05
SINKHORN_ITERS = 3
#: TensorFlow's ``l2_normalize`` epsilon (on the squared norm).
L2_EPS = 1e-12
#: G of blocks 0..5 (paper Sec. 5.1, code ``prototypeLayers``).
DEFAULT_PROTOTYPES = [2048, 1024, 512, 256, 128, 64]


class ALPOptions(ModelOptions):
    """Options of the ALP layers (``model.options.alp`` of ``hart``); FedAli's defaults (getalp/FedAli alp_model.py, main.py)."""

    prototypes: list[int] = Field(
        list(DEFAULT_PROTOTYPES), min_length=1,
        description="G per block (as many as model.options.kernels); paper and code: 2048, 1024, 512, 256, 128, 64",
    )
    beta: float = Field(0.2, ge=0, le=1, description="influence beta of the matched prototypes (Eq. 7); paper and code 0.2")
    gamma: float = Field(0.999, ge=0, le=1, description="EMA decay gamma of the local prototypes (Eq. 5); paper and code 0.999")
    glu: bool = Field(True, description="GLU on the matched prototypes (Eq. 6); false: the 'w/o GLU' ablation (Table 4)")
    use_global: bool = Field(
        True, description="global prototypes; false: the 'w/o global prototype' ablation: training matches and "
        "updates the local set only",
    )
    use_local: bool = Field(
        True, description="local prototypes; false: the 'w/o local prototype' ablation: no local set, no EMA "
        "update, training and inference match the global set, which FedAli's server then never re-clusters "
        "(it clusters the clients' local sets): the global prototypes keep their N(0, 1) start",
    )
    matcher: Literal["ot", "cosine", "euclidean"] = Field(
        "ot", description="ot: Sinkhorn plan on cosines (the paper); cosine: argmax cosine; euclidean: argmin "
        "distance of normalised vectors (Table 4's 'Distance' rows, the code's 'cossine' / 'euclidean')",
    )
    update: Literal["single", "soft_code", "soft_paper"] = Field(
        "single", description="local prototype EMA: single (best prototype of each token, raw token; what "
        "from-scratch FedAli ran), soft_code (top max(B//G,1) tokens per prototype, raw), soft_paper "
        "(top ceil(B*Z/G), normalised tokens; the paper's text)",
    )

    @model_validator(mode="after")
    def _check(self) -> ALPOptions:
        if not (self.use_global or self.use_local):
            raise ValueError("use_global and use_local cannot both be false (no prototypes left)")
        if self.update != "single" and self.matcher != "ot":
            raise ValueError(f"update={self.update} weighs tokens by the transport plan: it needs matcher=ot")
        if any(g < 1 for g in self.prototypes):
            raise ValueError("every prototype count must be >= 1")
        return self


def l2_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """TensorFlow's ``tf.math.l2_normalize``: ``x / sqrt(max(sum x^2, 1e-12))``."""
    return x * torch.rsqrt(torch.clamp((x * x).sum(dim, keepdim=True), min=L2_EPS))


def sinkhorn(scores: torch.Tensor, eps: float = SINKHORN_EPS, iterations: int = SINKHORN_ITERS) -> torch.Tensor:
    """Sinkhorn-Knopp plan of a (tokens N x prototypes P) similarity matrix (paper Eq. 4).

    As the authors' ``sinkhorn_matrix`` (``alp_model.py``): ``Q = exp(S / eps) / sum``, then
    ``iterations`` times: rows to sum 1/N, columns to sum 1/P; finally ``Q * P``. So the columns
    sum to exactly 1 and the rows to about P/N (exactly in the limit of many iterations).
    Computed in float32.
    """
    q = (scores.float() / eps).exp_()
    q /= q.sum()
    n, p = q.shape
    for _ in range(iterations):  # in place, one division per pass (the code divides twice)
        q /= q.sum(dim=1, keepdim=True) * n
        q /= q.sum(dim=0, keepdim=True) * p
    return q.mul_(p)


def match_scores(x: torch.Tensor, protos: torch.Tensor, matcher: str) -> torch.Tensor:
    """Scores of tokens (N x d) against prototypes (G x d); larger is better for every matcher.

    ``ot``: the Sinkhorn plan of normalised cosines; ``cosine``: ``x.p / (|x||p| + 1e-7)``;
    ``euclidean``: minus the distance between the ``(v / (|v| + 1e-7))``-normalised vectors
    (the code's ``cossine_similirity_matching`` / ``euclidean_distance_matching``).
    """
    if matcher == "ot":
        return sinkhorn(l2_normalize(x) @ l2_normalize(protos).T)
    nx, np_ = x.norm(dim=1, keepdim=True), protos.norm(dim=1, keepdim=True)
    if matcher == "cosine":
        return (x @ protos.T) / (nx @ np_.T + 1e-7)
    if matcher == "euclidean":
        a, b = x / (nx + 1e-7), protos / (np_ + 1e-7)
        d2 = (a * a).sum(1, keepdim=True) - 2 * a @ b.T + (b * b).sum(1)[None, :]
        return -torch.sqrt(torch.clamp(d2, min=0.0))
    raise ValueError(f"unknown matcher {matcher!r}")


def single_update(protos: torch.Tensor, assign: torch.Tensor, x: torch.Tensor, gamma: float) -> None:
    """In place: ``P[a_i] = gamma * P[a_i] + (1 - gamma) * x_i`` (``alp_model.py``'s single update).

    Where several tokens pick one prototype, the last token (largest row index of ``x``) wins:
    the update uses the prototype's value before this step and that token. Prototypes no token
    picked are left bitwise unchanged. Every row is computed and the picked ones kept
    (``torch.where``): no boolean indexing, whose size the host would wait for on a GPU.
    """
    if len(assign) == 0:
        return
    order = torch.arange(len(assign), device=assign.device)
    last = torch.full((len(protos),), -1, dtype=torch.long, device=assign.device)
    last.scatter_reduce_(0, assign, order, reduce="amax", include_self=True)
    hit = (last >= 0).unsqueeze(1)
    moved = gamma * protos + (1 - gamma) * x[last.clamp(min=0)]
    protos.copy_(torch.where(hit, moved, protos))


def soft_update(protos: torch.Tensor, plan: torch.Tensor, x: torch.Tensor, k: int, gamma: float) -> None:
    """In place, every prototype g: ``P[g] = gamma * P[g] + (1 - gamma) * sum_j w_gj x_j`` over its
    top-``k`` tokens j in the plan (``plan``: N x G), ``w`` their plan weights normalised to sum 1
    (``alp_model.py``'s soft update; paper Eq. 5)."""
    w, idx = torch.topk(plan.T, k, dim=1)
    w = w / w.sum(dim=1, keepdim=True)
    protos.mul_(gamma).add_((1 - gamma) * (w.unsqueeze(-1) * x[idx]).sum(1))


class GLU(nn.Module):
    """``GLU(z) = a[:, :d] * sigmoid(a[:, d:])`` with ``a = Dense(2d)(z)`` (Dauphin et al. 2017)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)
        self.dim = dim

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        a = self.linear(z)
        return a[..., : self.dim] * torch.sigmoid(a[..., self.dim :])


class ALP(nn.Module):
    """One ALP layer: tokens ``(B, Z, d)`` -> aligned, L2-normalised tokens ``(B, Z, d)``.

    Buffers (state, not parameters): ``local_prototypes`` and ``global_prototypes`` (G x d,
    independent N(0, 1) draws; absent when ``use_local`` / ``use_global`` is off) and ``beta``.
    The GLU's Dense is Keras-initialised by the model that holds the layer.
    """

    def __init__(self, dim: int, count: int, options: ALPOptions) -> None:
        super().__init__()
        self.dim, self.count = dim, count
        self.gamma = options.gamma
        self.matcher = options.matcher
        self.update = options.update
        self.use_local, self.use_global = options.use_local, options.use_global
        if self.use_local:
            self.register_buffer("local_prototypes", torch.randn(count, dim))
        if self.use_global:
            self.register_buffer("global_prototypes", torch.randn(count, dim))
        self.register_buffer("beta", torch.full((1,), float(options.beta)))  # (1,): Flower arrays have no 0-d
        self.glu = GLU(dim) if options.glu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, z, d = x.shape
        flat = x.reshape(b * z, d)
        with torch.no_grad():
            matched = self._match(flat.detach(), b)
        g = self.glu(matched) if self.glu is not None else matched
        out = self.beta * g + (1 - self.beta) * flat
        return l2_normalize(out.reshape(b, z, d))

    def _match(self, xs: torch.Tensor, batch: int) -> torch.Tensor:
        """Matched prototypes M (N x d), and in training the local prototypes' EMA update."""
        if not self.training:
            protos = self.local_prototypes if self.use_local else self.global_prototypes
            return protos[match_scores(xs, protos, self.matcher).argmax(1)]
        sets = ([self.local_prototypes] if self.use_local else []) + ([self.global_prototypes] if self.use_global else [])
        scores = match_scores(xs, torch.cat(sets), self.matcher)
        g = self.count
        local = scores[:, :g] if self.use_local else None
        if self.use_global:
            matched = self.global_prototypes[scores[:, -g:].argmax(1)]
        else:
            matched = self.local_prototypes[local.argmax(1)]  # gathered before the update
        if self.use_local:
            if self.update == "single":
                single_update(self.local_prototypes, local.argmax(1), xs, self.gamma)
            elif self.update == "soft_code":
                soft_update(self.local_prototypes, local, xs, max(batch // g, 1), self.gamma)
            else:  # soft_paper
                soft_update(self.local_prototypes, local, l2_normalize(xs), math.ceil(len(xs) / g), self.gamma)
        return matched


__all__ = ["ALP", "ALPOptions", "DEFAULT_PROTOTYPES", "GLU", "l2_normalize", "match_scores", "single_update",
           "sinkhorn", "soft_update"]
