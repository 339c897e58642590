"""HART (Ek, Portet, Lalanda, "Transformer-based models to deal with heterogeneous environments
in human activity recognition", Pers. Ubiquitous Comput. 2023), as FedAli runs it (getalp/FedAli
``model.py``), optionally with FedAli's ALP layers (``alp_model.py``, ``models/alp.py``).

Layout for ``(B, T=128, C=6)`` windows (channels 0-2 accelerometer, 3-5 gyroscope), D = 192:

- patches: one Conv1D(D/2, kernel = stride = 16, valid) per sensor (acc, gyro), concatenated
  (channels 0-95 acc, 96-191 gyro): ``T/16 = 8`` tokens; plus a learned position embedding;
- 6 blocks, conv kernels K_l = [3, 7, 15, 31, 31, 31], DropPath rates linspace(0, 0.3, 6):
  ``x1 = LN(h)`` (-> ``ALP_l(x1)`` with ALP); branches: MHA (3 heads, key_dim 48, attention
  dropout 0.3) on ``x1[..., 0:48]``, liteFormer on ``x1[..., 48:144]``, MHA on ``x1[..., 144:192]``,
  each MHA followed by DropPath; ``x2 = concat + h``; ``h = DropPath(MLP(LN(x2))) + x2`` with
  MLP = Dense(2D, swish) -> Dropout(0.3) -> Dense(D);
- ``body`` ends with LayerNorm and global average pooling over tokens: ``features(x)`` is the
  D-dim embedding MOON, FedProto and FedPAC use; ``head`` = Dense(1024, swish) -> Dropout(0.3)
  -> Dense(Q).

The head returns **logits**: fedwear's criterion is cross-entropy on logits, where Keras
applied softmax and a categorical cross-entropy on probabilities clipped to [1e-7, 1 - 1e-7]
(Keras 2.15, which FedAli's code runs); the two differ only where that clip bites.

Keras initialisation (Keras 2.15's defaults): ``glorot_uniform`` kernels with zero biases for
every Dense / Conv1D / MultiHeadAttention projection, with Keras' fan rule for the rank-3
attention kernels (``(48, 3, 48)`` and ``(3, 48, 48)``: fan = dims x receptive field of the
leading dims); Embedding U(-0.05, 0.05); LayerNorm eps 1e-6; liteFormer kernels glorot on
``(K, 1, 1)`` = U(+-sqrt(3/K)).

``liteformer`` (FedAli's ``model.py::liteFormer``): ``code`` (default: the published numbers came from it) is the
authors' old liteFormer as FedAli ran it: a raw ``reshape(-1, 4, T)`` so each head's kernel
slides over 8 consecutive *channels* and the output reshape **mixes samples of a batch**,
DropPath over the 4 heads, and at every training forward the stored kernels are replaced by
their softmax (softmax of softmax ...; gradients then update the post-softmax values). In this
mode a sample's output depends on the other samples of its batch, at training *and* at
evaluation: evaluate with batch 32 as Keras' ``evaluate`` did (``evaluation.batch_size: 32``).
``fixed`` is the HART repository's later fix (getalp/Lightweight-Transformer-Models-For-HAR-on-
Mobile-Devices@0b8b39b): ``reshape(-1, T, 4)``, per-head conv over the second axis, no
cross-sample mixing (still over groups of channels of one token, and the same in-place
softmax; DropPath over those groups). ``time`` is what the HART paper describes: the D/2
channels in 4 heads of D/8 channels, each head's softmax-normalised kernel (a function of the
parameter, never stored) sliding over the tokens (time), DropPath per sample.

Other shapes: the sensors are groups of 3 channels when C is a multiple of 3 (acc | gyro | mag
...; the authors' two- and three-sensor patch layers), otherwise all channels form one group
(``sensors`` overrides); each group gets its own patch convolution with D / groups filters.
The MHA | liteFormer | MHA split of the D channels stays D/4 | D/2 | D/4 whatever the groups.
Tokens: ``(T - p) // p + 1`` (a valid convolution: trailing samples are dropped). A shape that
cannot work is a one-line :class:`fedwear.errors.ConfigError`.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from pydantic import Field, PositiveInt, field_validator
from torch import nn

from fedwear.errors import ConfigError
from fedwear.models.alp import ALP, ALPOptions
from fedwear.models.base import ModelOptions, SplitModel

#: LayerNorm epsilon of every Keras LayerNormalization in HART (``model.py``).
LN_EPS = 1e-6


def keras_fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """Keras' ``_compute_fans`` for a kernel of the given *Keras* shape (..., in, out)."""
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    field = math.prod(shape[:-2])
    return shape[-2] * field, shape[-1] * field


def glorot_(w: torch.Tensor, keras_shape: tuple[int, ...]) -> None:
    """In place ``glorot_uniform`` with the fans of the Keras kernel shape ``keras_shape``."""
    fan_in, fan_out = keras_fans(keras_shape)
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        w.uniform_(-limit, limit)


def dense(n_in: int, n_out: int) -> nn.Linear:
    """A Keras Dense: glorot_uniform kernel, zero bias."""
    layer = nn.Linear(n_in, n_out)
    glorot_(layer.weight, (n_in, n_out))
    nn.init.zeros_(layer.bias)
    return layer


def layer_norm(dim: int) -> nn.LayerNorm:
    return nn.LayerNorm(dim, eps=LN_EPS)


class DropPath(nn.Module):
    """Keras-HART's DropPath (``model.py``): a mask per element of dim 0, ``floor(keep + U[0, 1))``,
    output ``x / keep * mask``; identity in eval mode or at rate 0."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = float(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        mask = torch.floor(keep + torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), dtype=x.dtype, device=x.device))
        return x / keep * mask

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


class SensorMHA(nn.Module):
    """Keras ``MultiHeadAttention(num_heads, key_dim, dropout)`` self-attention on one slice of
    the tokens: Q, K, V project ``dim -> heads x key_dim`` (bias), scores scaled by
    1/sqrt(key_dim), softmax, dropout on the probabilities, output ``heads x key_dim -> dim``."""

    def __init__(self, dim: int, heads: int, key_dim: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.key_dim = heads, key_dim
        inner = heads * key_dim
        self.query, self.key, self.value = (nn.Linear(dim, inner) for _ in range(3))
        self.out = nn.Linear(inner, dim)
        for lin in (self.query, self.key, self.value):
            glorot_(lin.weight, (dim, heads, key_dim))  # Keras EinsumDense kernel "abc,cde->abde"
            nn.init.zeros_(lin.bias)
        glorot_(self.out.weight, (heads, key_dim, dim))  # "abcd,cde->abe"
        nn.init.zeros_(self.out.bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def split(lin: nn.Linear) -> torch.Tensor:
            return lin(x).view(b, t, self.heads, self.key_dim).transpose(1, 2)

        q, k, v = split(self.query), split(self.key), split(self.value)
        att = torch.softmax((q / math.sqrt(self.key_dim)) @ k.transpose(-1, -2), dim=-1)
        o = (self.dropout(att) @ v).transpose(1, 2).reshape(b, t, self.heads * self.key_dim)
        return self.out(o)


def band_matrix(weight: torch.Tensor, t: int) -> torch.Tensor:
    """Each head's (T x T) matrix of a 'same'-padded cross-correlation: ``M[s, t] = w[s - t + (K-1)//2]``
    (zero outside the kernel), from ``weight`` (h, 1, K) -> (h, T, T)."""
    k = weight.shape[-1]
    steps = torch.arange(t, device=weight.device)
    offset = steps[:, None] - steps[None, :] + (k - 1) // 2
    inside = (offset >= 0) & (offset < k)
    return weight[:, 0, offset.clamp(0, k - 1)] * inside


def same_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.conv1d(x, weight, padding="same", groups=h)`` for ``x`` (N, h, T), ``weight`` (h, 1, K),
    as a matmul with the band matrices: with few tokens and long kernels (8 and 31) nearly all of
    the padded convolution multiplies zeros, and CPU convolutions were a third of a training step."""
    return torch.einsum("nhs,hst->nht", x, band_matrix(weight, x.shape[-1]))


class LiteFormer(nn.Module):
    """HART's liteFormer on ``(B, T, width)`` tokens, in the three modes of the module docstring."""

    def __init__(self, width: int, heads: int, kernel: int, drop_path: float, mode: str) -> None:
        super().__init__()
        self.width, self.heads, self.kernel, self.mode = width, heads, kernel, mode
        self.weight = nn.Parameter(torch.empty(heads, 1, kernel))
        glorot_(self.weight, (kernel, 1, 1))  # each head's Keras kernel (K, 1, 1): U(+-sqrt(3/K))
        self.drop_path = DropPath(drop_path)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        b, t, c = u.shape
        if self.mode == "time":
            x = u.transpose(1, 2).reshape(b, self.heads, c // self.heads, t)  # heads of D/8 channels
            band = band_matrix(torch.softmax(self.weight, dim=-1), t)
            out = torch.einsum("bhgs,hst->bhgt", x, band).reshape(b, c, t).transpose(1, 2)
            return self.drop_path(out)
        if self.training:  # the stored kernels become their softmax, at every training forward
            with torch.no_grad():
                self.weight.copy_(torch.softmax(self.weight, dim=-1))
        h = self.heads
        if self.mode == "code":
            r = u.reshape(-1, h, t)  # (B*c/h, h, T): raw reshape, no transpose (FedAli's liteFormer)
            s = same_conv(r, self.weight).transpose(0, 1)  # (h, B*c/h, T)
            return self.drop_path(s.contiguous()).reshape(b, t, c)  # DropPath over heads; mixes samples
        r = u.reshape(-1, t, h)  # fixed: NWC, conv over the second axis, per head
        s = same_conv(r.transpose(1, 2), self.weight).transpose(1, 2)
        return self.drop_path(s.contiguous()).reshape(b, t, c)

    def extra_repr(self) -> str:
        return f"width={self.width}, heads={self.heads}, kernel={self.kernel}, mode={self.mode}"


class Block(nn.Module):
    """One HART block (``model.py``), with an ALP layer after the first LayerNorm when given."""

    def __init__(self, dim: int, heads: int, lite_heads: int, kernel: int, dropout: float, drop_path: float,
                 liteformer: str, alp: ALP | None) -> None:
        super().__init__()
        q = dim // 4
        self.q = q
        self.norm1 = layer_norm(dim)
        self.alp = alp
        self.acc_mha = SensorMHA(q, heads, q, dropout)
        self.lite = LiteFormer(dim // 2, lite_heads, kernel, drop_path, liteformer)
        self.gyro_mha = SensorMHA(q, heads, q, dropout)
        self.acc_drop, self.gyro_drop = DropPath(drop_path), DropPath(drop_path)
        self.norm2 = layer_norm(dim)
        self.mlp = nn.Sequential(dense(dim, 2 * dim), nn.SiLU(), nn.Dropout(dropout), dense(2 * dim, dim))
        self.mlp_drop = DropPath(drop_path)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x1 = self.norm1(h)
        if self.alp is not None:
            x1 = self.alp(x1)
        q, half = self.q, 2 * self.q
        acc = self.acc_drop(self.acc_mha(x1[..., :q]))
        lite = self.lite(x1[..., q : q + half])
        gyro = self.gyro_drop(self.gyro_mha(x1[..., q + half :]))
        x2 = torch.cat([acc, lite, gyro], dim=-1) + h
        return self.mlp_drop(self.mlp(self.norm2(x2))) + x2


class Body(nn.Module):
    """Patches + position embedding, the blocks, LayerNorm, average over tokens -> ``(B, D)``."""

    def __init__(self, channels: int, groups: int, dim: int, patch: int, tokens: int, blocks: list[Block]) -> None:
        super().__init__()
        self.groups, self.patch = groups, patch
        per = channels // groups
        self.patches = nn.ModuleList(nn.Conv1d(per, dim // groups, patch, stride=patch) for _ in range(groups))
        for conv in self.patches:
            glorot_(conv.weight, (patch, per, dim // groups))
            nn.init.zeros_(conv.bias)
        self.position = nn.Parameter(torch.empty(tokens, dim).uniform_(-0.05, 0.05))  # Keras Embedding init
        self.blocks = nn.ModuleList(blocks)
        self.norm = layer_norm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        per = x.shape[2] // self.groups
        xt = x.transpose(1, 2)
        h = torch.cat([conv(xt[:, i * per : (i + 1) * per]) for i, conv in enumerate(self.patches)], dim=1)
        h = h.transpose(1, 2) + self.position
        for block in self.blocks:
            h = block(h)
        return self.norm(h).mean(dim=1)


class HARTOptions(ModelOptions):
    projection_dim: PositiveInt = Field(192, description="token width D (getalp/FedAli model.py: 192); a multiple of 8")
    patch_size: PositiveInt = Field(16, description="patch length = stride in samples (model.py: 16 -> 8 tokens of 128)")
    kernels: list[PositiveInt] = Field(
        [3, 7, 15, 31, 31, 31], min_length=1, description="liteFormer kernel per block; one block each (model.py)"
    )
    num_heads: PositiveInt = Field(3, description="heads of each sensor MHA (key_dim D/4; model.py)")
    lite_heads: PositiveInt = Field(4, description="liteFormer heads (the code's filterAttentionHead 4)")
    dropout: float = Field(0.3, ge=0, lt=1, description="attention, MLP and head dropout (model.py: 0.3)")
    drop_path: float = Field(0.3, ge=0, lt=1, description="DropPath rate of the last block; linspace(0, rate, blocks) (model.py: 0.3)")
    head_units: PositiveInt = Field(1024, description="hidden Dense(swish) of the head (model.py: 1024)")
    sensors: PositiveInt | None = Field(
        None, description="channel groups with their own patch convolution; null: C/3 groups of 3 (acc, gyro, "
        "...) when C is a multiple of 3, else one group",
    )
    liteformer: Literal["code", "fixed", "time"] = Field(
        "code", description="code: the authors' liteFormer as FedAli ran it (mixes samples of a batch, in-place "
        "softmax; the published numbers; evaluate with batch 32); fixed: the HART repository's fix (no mixing); "
        "time: the HART paper's per-head conv over tokens (getalp/Lightweight-Transformer-Models-For-HAR-on-Mobile-Devices model.py)",
    )
    alp: ALPOptions | None = Field(
        None, description="FedAli's ALP layer after each block's first LayerNorm (alp_model.py); null: plain HART "
        "(method fedali turns it on with these options or the defaults); true: the defaults",
    )

    @field_validator("alp", mode="before")
    @classmethod
    def _alp_flag(cls, v: object) -> object:
        if v is True:
            return {}
        return None if v is False else v


class HART(SplitModel):
    """HART (``model.py``) for ``[B, T, C]`` windows; with ``alp`` options, HART-ALP (``alp_model.py``).

    ``body``: patches, position embedding, blocks, LayerNorm, GAP -> ``(B, D)``; ``head``:
    Dense(1024, swish) -> Dropout -> Dense(Q) -> logits. Defaults reproduce FedAli's HART:
    1,445,918 parameters for Q = 6 (``tests/test_hart.py`` counts them by layer).
    """

    Options = HARTOptions

    def __init__(
        self,
        window: int,
        channels: int,
        num_classes: int,
        projection_dim: int = 192,
        patch_size: int = 16,
        kernels: list[int] | None = None,
        num_heads: int = 3,
        lite_heads: int = 4,
        dropout: float = 0.3,
        drop_path: float = 0.3,
        head_units: int = 1024,
        sensors: int | None = None,
        liteformer: str = "code",
        alp: ALPOptions | dict | None = None,
    ) -> None:
        super().__init__()
        kernels = list(kernels or [3, 7, 15, 31, 31, 31])
        d = projection_dim
        groups = sensors or (channels // 3 if channels % 3 == 0 else 1)
        if isinstance(alp, dict):
            alp = ALPOptions(**alp)
        problems = [
            (d % 8 != 0, f"projection_dim={d} is not a multiple of 8 (D/4 per MHA, D/2 liteFormer channels)"),
            ((d // 2) % lite_heads != 0 or d // 2 < lite_heads,
             f"projection_dim/2={d // 2} is not a multiple of lite_heads={lite_heads}"),
            (channels % groups != 0, f"{channels} channels cannot form sensors={groups} equal groups"),
            (d % groups != 0, f"projection_dim={d} is not divisible by sensors={groups}"),
            (window < patch_size, f"window {window} is shorter than patch_size={patch_size}"),
            (liteformer not in ("code", "fixed", "time"), f"liteformer={liteformer!r} (code, fixed or time)"),
            (alp is not None and len(alp.prototypes) != len(kernels),
             f"alp.prototypes has {len(alp.prototypes) if alp else 0} counts for {len(kernels)} blocks (kernels)"),
        ]
        for bad, why in problems:
            if bad:
                raise ConfigError(f"model.name=hart: {why}")
        tokens = (window - patch_size) // patch_size + 1
        rates = np.linspace(0.0, drop_path, len(kernels))  # the code: linspace(0, dropout * 10, 6) * 0.1
        blocks = []
        for i, k in enumerate(kernels):
            layer = None
            if alp is not None:
                layer = ALP(d, alp.prototypes[i], alp)
                if layer.glu is not None:
                    glorot_(layer.glu.linear.weight, (d, 2 * d))
                    nn.init.zeros_(layer.glu.linear.bias)
            blocks.append(Block(d, num_heads, lite_heads, k, dropout, float(rates[i]), liteformer, layer))
        self.body = Body(channels, groups, d, patch_size, tokens, blocks)
        self.head = nn.Sequential(dense(d, head_units), nn.SiLU(), nn.Dropout(dropout), dense(head_units, num_classes))
        self.tokens = tokens
        # the code's liteFormer mixes the samples of a batch (F1.3 b): outputs depend on batch-mates
        self.batch_dependent = liteformer == "code"

    def alp_layers(self) -> dict[str, ALP]:
        """The ALP layers by state-dict prefix (``body.blocks.<l>.alp``), in block order."""
        return {f"body.{name}": m for name, m in self.body.named_modules() if isinstance(m, ALP)}


__all__ = ["HART", "HARTOptions", "DropPath", "LiteFormer", "keras_fans"]
