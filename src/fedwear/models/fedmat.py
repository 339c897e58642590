"""FedMAT's networks (poster Eq. 4-5; Super-Shen/FedMAT ``iLog_models.py``, classes
``server``, ``cnn_block``, ``soft_Attn_Merge``, ``client_sp``), with the code's bugs fixed.

**Input** (fedwear's grouping; the code's iLog features are not public): Meta-HAR's FFT tensor (``models/spectral.py``)
without the frequency rows: one magnitude row per axis, 4 rows per 3-axis sensor with its
magnitude axis (the code's "4D" sensors; 3 rows, its "3D" ones, with ``magnitude: false``),
frequency bins along W, the intervals as the recurrent time axis T. ``interval`` 20 gives
W = 11 bins, the width of the code's ``[5, 21, 11]`` tensor, which its conv stack reduces to
1 (11 -> 5 -> 2 -> 1) and its fusion to the GRU's 192 inputs; windows of 128 samples give
T = 6 intervals, 150 give T = 7 (the whole window is used: ``samples: null``).

**Shared network** ``body`` (Theta_c, trained federatedly with the pairwise loss), per 3-axis
sensor s a branch (the poster's modality-specific CNN; one per sensor, own weights, as
Meta-HAR's sensor branches: the code's two branches are its "3D" and "4D" sensor groups):

- ``conv1`` = Conv3d(1 -> 64, k=(1,A,3), s=(1,A,3), p=(0,0,2)) + BN + ReLU + Dropout(0.2)
  -> ``[B, 64, T, 1, 5]``; ``conv2`` = Conv3d(64 -> 64, k=(1,1,3), s=(1,1,2)) + BN + ReLU
  -> ``[..., 2]``; ``conv3`` = Conv3d(64 -> 64, k=(1,1,2), s=(1,1,2)) + BN + ReLU -> ``[..., 1]``;
- fusion input ``[B, 1, T, S, 64]``: each branch's 64 channels become the width by a
  **permute** (bug (a) fixed), sensors on the rows; ``fusion.0`` = Conv3d(1 -> 64, k=(1,S,1),
  s=(1,S,1)) -> ``[B, 64, T, 1, 64]``; ``fusion.1`` = Conv3d(64 -> 64, k=(1,1,8), s=(1,1,8)) ->
  ``[..., 8]``; ``fusion.2`` = Conv3d(64 -> 64, k=(1,1,4), s=(1,1,2)) -> ``[B, 64, T, 1, 3]``;
  each + BN + ReLU;
- ``[B, T, 192]`` (permute, time stays on T) -> ``GRU(192, 100, 2 layers, batch_first=True)``
  (bug (b) fixed: the code's GRU recurred over the batch) -> mean over T -> the 100-d embedding.

``body(x)`` returns a :class:`SharedOutput`: the embedding (for the pairwise loss, prototypes,
``features(x)``) **and** the activations p^l that the client network's masks read.

**Client-specific network** ``head`` (W_u; ``client_sp``): its own copies of every shared conv
(``branches.<s>.convs``, ``fusion``; :meth:`FedMAT.copy_shared_to_client` loads them and the
GRU from the shared network, as the code does before each adaptation), attention masks, its own
``GRU(192, 100, 2)`` (mean over T) and ``Linear(100, Q)`` returning **logits** (bug (c) fixed: no
softmax before the cross-entropy). A mask module (MTAN-style) reads the shared activation p and
the client's activation a of the same shape: rows interleaved ``[p_0, a_0, p_1, a_1, ...]`` ->
Conv3d(C, C, k=(1,2,1), s=(1,2,1)) -> BN -> ReLU -> Conv3d(C, C, 1) -> BN -> Sigmoid. Per
branch (poster Eq. 4-5, ``e^l = M^l * p^l``, ``M^l = h(g([p^l; f(e^(l-1))]))``)::

    M0 = mask0([x; x]),   e0 = M0 * x,   a1 = conv1(e0)
    M1 = mask1([p1; a1]), e1 = M1 * p1,  a2 = conv2(e1)
    M2 = mask2([p2; a2]), e2 = M2 * p2,  a3 = conv3(e2)      (own mask2: the code reused mask1)

then the fusion: ``a_m0`` = the a3 of all branches arranged as the fusion input; four masks on
the shared fusion input and its three conv outputs in the same pattern; ``e_m3 = M_m3 * p_m3``
-> GRU -> mean -> Linear. Masks are 1-channel at the inputs (x, fusion input), 64 elsewhere.

``masks`` (the poster's ablations; which masks each drops is fedwear's reading): ``all``; ``no_sensor`` (FedMAT-noSMask) drops
the branch masks; ``no_fusion`` (FedMAT-noFMask) drops the fusion masks. Their modules are not
built (nothing of them in the state dict). A level without a mask passes the client's own
activation on (``e^l = a^l``, a^0 = x): the branch, or the fusion, is then the client's own
CNN. Removing a mask removes that level's attention to the shared network, not the client's
path; with ``e^l = p^l`` instead (a mask of ones), ``no_fusion`` would leave the client's
output independent of every sensor mask.

Defaults (``iLog_models.py``, ``iLog_train.py`` config): 64 filters, dropout 0.2 (after each branch's
first conv, shared and client copies, as the code), GRU hidden 100 with 2 layers; PyTorch's
default initialisation. Parameters for acc + gyro windows and Q classes: shared 242,304; client
331,035 + 101 Q with all masks (``tests/test_fedmat_model.py`` counts them by layer).

In a method: ``features(x)`` is the embedding (pairwise loss), ``head(body(x))`` the logits.
FedAvg's predictor pairs ``features`` with ``head``, which cannot work here: a FedMAT method
builds its predictor on the whole model (``body = model``, ``head = None``, one key over
``body.*`` and ``head.*``), so the evaluation cache keeps logits, not the activations (41,484
floats, 166 KB, per window of 150 x 6), and every user's fine-tuned shared network is its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Literal

import torch
from pydantic import Field, PositiveInt
from torch import nn

from fedwear.errors import ConfigError
from fedwear.models.base import ModelOptions, SplitModel
from fedwear.models.deepsense import conv_block
from fedwear.models.spectral import Spectral

MaskSet = Literal["all", "no_sensor", "no_fusion"]
Tensor = torch.Tensor


@dataclass(frozen=True)
class SharedOutput:
    """What the shared network gives for a batch: ``embedding`` ``[B, hidden]`` and the
    activations p^l the client network reads, per sensor s: ``inputs[s]`` (p^0, its FFT rows
    ``[B, 1, T, A, W]``), ``conv1[s]``, ``conv2[s]`` (p^1, p^2); ``fusion`` = (the fusion input,
    the outputs of ``fusion.0``, ``.1``, ``.2``).

    Batch-like: ``len()`` is B, indexing and slicing (``out[i:j]``, ``out[index_tensor]``)
    select windows of every tensor, :meth:`cat` concatenates batches, ``to``, ``cpu`` and
    ``detach`` act on every tensor, :meth:`map` applies any function to every tensor. What the
    evaluation cache's ``forward`` does with features then works on it, with ``SharedOutput.cat``
    in place of ``torch.cat``.
    """

    embedding: Tensor
    inputs: tuple[Tensor, ...]
    conv1: tuple[Tensor, ...]
    conv2: tuple[Tensor, ...]
    fusion: tuple[Tensor, ...]

    def map(self, fn: Callable[[Tensor], Tensor]) -> SharedOutput:
        """``fn`` applied to every tensor."""
        values = {}
        for f in fields(self):
            v = getattr(self, f.name)
            values[f.name] = fn(v) if isinstance(v, Tensor) else tuple(fn(t) for t in v)
        return SharedOutput(**values)

    @classmethod
    def cat(cls, parts: Sequence[SharedOutput]) -> SharedOutput:
        """Batches concatenated (``torch.cat`` of every tensor, in order)."""
        values = {}
        for f in fields(cls):
            vs = [getattr(p, f.name) for p in parts]
            values[f.name] = torch.cat(vs) if isinstance(vs[0], Tensor) else tuple(torch.cat(ts) for ts in zip(*vs, strict=True))
        return cls(**values)

    def detach(self) -> SharedOutput:
        return self.map(Tensor.detach)

    def to(self, *args: object, **kwargs: object) -> SharedOutput:
        """Every tensor ``.to(...)`` (a device or dtype), as ``Tensor.to``."""
        return self.map(lambda t: t.to(*args, **kwargs))

    def cpu(self) -> SharedOutput:
        return self.map(Tensor.cpu)

    def __len__(self) -> int:
        return self.embedding.shape[0]

    def __getitem__(self, index: object) -> SharedOutput:
        return self.map(lambda t: t[index])


def to_fusion(branch_outputs: Sequence[Tensor]) -> Tensor:
    """Branch outputs ``[B, F, T, 1, W]`` -> the fusion input ``[B, 1, T, S, F * W]``: each
    branch's channels become the width (channel-major) by a permute, sensors on the rows."""
    rows = [h.permute(0, 2, 3, 1, 4).flatten(3).unsqueeze(1) for h in branch_outputs]
    return torch.cat(rows, dim=3)


def to_sequence(h: Tensor) -> Tensor:
    """``[B, F, T, H, W]`` -> ``[B, T, F * H * W]``: time stays on T (the code's reshape without permute fixed)."""
    return h.permute(0, 2, 1, 3, 4).flatten(2)


def interleave_rows(p: Tensor, a: Tensor) -> Tensor:
    """``[B, C, T, H, W]`` x 2 -> ``[B, C, T, 2H, W]`` with rows ``p_0, a_0, p_1, a_1, ...``."""
    return torch.stack([p, a], dim=4).flatten(3, 4)


class MaskModule(nn.Module):
    """``h(g([p; a]))`` (poster Eq. 5): pair conv over the interleaved rows, BN, ReLU, 1x1 conv,
    BN, Sigmoid -> a mask in (0, 1) of p's shape (``soft_Attn_Merge.gen_mask_conv``)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.g = nn.Sequential(nn.Conv3d(channels, channels, (1, 2, 1), (1, 2, 1)), nn.BatchNorm3d(channels), nn.ReLU())
        self.h = nn.Sequential(nn.Conv3d(channels, channels, 1), nn.BatchNorm3d(channels), nn.Sigmoid())

    def forward(self, p: Tensor, a: Tensor) -> Tensor:
        return self.h(self.g(interleave_rows(p, a)))


class Branch(nn.Module):
    """One sensor's three convs (``iLog_models.py`` ``cnn_block``); the client's copy may hold its three masks."""

    def __init__(self, axes: int, filters: int, dropout: float, masks: bool = False) -> None:
        super().__init__()
        self.convs = nn.ModuleList([
            conv_block(1, filters, (1, axes, 3), (1, axes, 3), (0, 0, 2), dropout),
            conv_block(filters, filters, (1, 1, 3), (1, 1, 2), (0, 0, 0), 0.0),
            conv_block(filters, filters, (1, 1, 2), (1, 1, 2), (0, 0, 0), 0.0),
        ])
        self.masks = nn.ModuleList([MaskModule(1), MaskModule(filters), MaskModule(filters)]) if masks else None


def fusion_convs(sensors: int, filters: int) -> nn.ModuleList:
    return nn.ModuleList([
        conv_block(1, filters, (1, sensors, 1), (1, sensors, 1), (0, 0, 0), 0.0),
        conv_block(filters, filters, (1, 1, 8), (1, 1, 8), (0, 0, 0), 0.0),
        conv_block(filters, filters, (1, 1, 4), (1, 1, 2), (0, 0, 0), 0.0),
    ])


def gru(inputs: int, hidden: int, layers: int) -> nn.GRU:
    return nn.GRU(inputs, hidden, layers, batch_first=True)


class SharedNetwork(nn.Module):
    """Theta_c: spectral input, sensor branches, fusion convs, GRU, mean over T."""

    def __init__(self, spectral: Spectral, filters: int, dropout: float, hidden: int, layers: int,
                 gru_inputs: int) -> None:
        super().__init__()
        self.spectral = spectral
        self.branches = nn.ModuleList(Branch(spectral.axes, filters, dropout) for _ in range(spectral.sensors))
        self.fusion = fusion_convs(spectral.sensors, filters)
        self.rnn = gru(gru_inputs, hidden, layers)
        self.out_features = hidden

    def forward(self, x: Tensor) -> SharedOutput:
        inputs = self.spectral(x).unsqueeze(1).split(self.spectral.rows_per_sensor, dim=3)
        p1, p2, p3 = [], [], []
        for branch, p0 in zip(self.branches, inputs, strict=True):
            p1.append(branch.convs[0](p0))
            p2.append(branch.convs[1](p1[-1]))
            p3.append(branch.convs[2](p2[-1]))
        m = [to_fusion(p3)]
        for conv in self.fusion:
            m.append(conv(m[-1]))
        out, _ = self.rnn(to_sequence(m[-1]))
        return SharedOutput(out.mean(dim=1), tuple(inputs), tuple(p1), tuple(p2), tuple(m))


class ClientNetwork(nn.Module):
    """W_u: conv copies, attention masks on the shared activations, own GRU, linear classifier."""

    def __init__(self, spectral: Spectral, filters: int, dropout: float, hidden: int, layers: int,
                 gru_inputs: int, num_classes: int, masks: str) -> None:
        super().__init__()
        sensor_masks, fusion_masks = masks != "no_sensor", masks != "no_fusion"
        self.branches = nn.ModuleList(
            Branch(spectral.axes, filters, dropout, masks=sensor_masks) for _ in range(spectral.sensors)
        )
        self.fusion = fusion_convs(spectral.sensors, filters)
        self.fusion_masks = (
            nn.ModuleList([MaskModule(1)] + [MaskModule(filters) for _ in range(3)]) if fusion_masks else None
        )
        self.rnn = gru(gru_inputs, hidden, layers)
        self.fc = nn.Linear(hidden, num_classes)

    def _run(self, z: SharedOutput, record: dict[str, Tensor] | None = None) -> Tensor:
        a3 = []
        for s, branch in enumerate(self.branches):
            p = (z.inputs[s], z.conv1[s], z.conv2[s])
            a = p[0]
            for level, conv in enumerate(branch.convs):
                e = a
                if branch.masks is not None:  # e^l = M^l * p^l, M^l = mask([p^l; a^l]); a^0 = x
                    mask = branch.masks[level](p[level], a)
                    e = mask * p[level]
                    if record is not None:
                        record[f"sensor{s}.level{level}"] = mask
                a = conv(e)
            a3.append(a)
        a = to_fusion(a3)
        e = a
        for level in range(4):
            if self.fusion_masks is not None:
                mask = self.fusion_masks[level](z.fusion[level], a)
                e = mask * z.fusion[level]
                if record is not None:
                    record[f"fusion.level{level}"] = mask
            else:
                e = a
            if level < 3:
                a = self.fusion[level](e)
        out, _ = self.rnn(to_sequence(e))
        return self.fc(out.mean(dim=1))

    def forward(self, z: SharedOutput) -> Tensor:
        return self._run(z)

    def masks(self, z: SharedOutput) -> dict[str, Tensor]:
        """The attention masks for ``z`` by level (``sensor<s>.level<l>``, ``fusion.level<l>``):
        what the poster's Fig. 3 visualises."""
        record: dict[str, Tensor] = {}
        self._run(z, record)
        return record


class FedMATOptions(ModelOptions):
    interval: int = Field(20, ge=2, description="samples per FFT interval: 20 -> 11 bins, the width "
                                  "of FedMAT's code input [5, 21, 11] (Super-Shen/FedMAT)")
    samples: PositiveInt | None = Field(None, description="use the first samples of a window; null: the whole window")
    magnitude: bool = Field(True, description="each 3-axis sensor's norm as a fourth row (the code's 4D sensors)"
                            "; false: 3 rows (its 3D sensors)")
    filters: PositiveInt = Field(64, description="filters of every conv (Super-Shen/FedMAT iLog_models.py: 64)")
    dropout: float = Field(0.2, ge=0, lt=1, description="after each branch's first conv (iLog_models.py: 0.2)")
    hidden: PositiveInt = Field(100, description="GRU hidden size = embedding size (iLog_models.py: 100)")
    rnn_layers: PositiveInt = Field(2, description="GRU layers, shared and client (iLog_models.py: 2)")
    masks: MaskSet = Field("all", description="all; no_sensor: FedMAT-noSMask (no branch masks); no_fusion: "
                           "FedMAT-noFMask (no fusion masks) (the poster's ablations)")


class FedMAT(SplitModel):
    """FedMAT (Super-Shen/FedMAT iLog_models.py, bugs fixed): ``body`` = the shared network (returns a
    :class:`SharedOutput`: embedding and activations), ``head`` = the client-specific network
    (masks on the shared activations, own GRU, logits); ``features(x)`` is the shared 100-d
    embedding."""

    Options = FedMATOptions

    def __init__(
        self,
        window: int,
        channels: int,
        num_classes: int,
        interval: int = 20,
        samples: int | None = None,
        magnitude: bool = True,
        filters: int = 64,
        dropout: float = 0.2,
        hidden: int = 100,
        rnn_layers: int = 2,
        masks: str = "all",
    ) -> None:
        super().__init__()
        if masks not in ("all", "no_sensor", "no_fusion"):
            raise ConfigError(f"model.name=fedmat: masks={masks!r} (all, no_sensor or no_fusion)")
        spectral = Spectral(window, channels, interval, samples, magnitude, frequency_rows="none", owner="fedmat")
        gru_inputs = self._gru_inputs(spectral.bins, spectral.sensors, filters, interval)
        self.masks = masks
        self.body = SharedNetwork(spectral, filters, dropout, hidden, rnn_layers, gru_inputs)
        self.head = ClientNetwork(spectral, filters, dropout, hidden, rnn_layers, gru_inputs, num_classes, masks)

    @staticmethod
    def _gru_inputs(bins: int, sensors: int, filters: int, interval: int) -> int:
        """The GRU's input size from the conv arithmetic (192 for 11 bins and 64 filters); a
        width the convs cannot take is a one-line ConfigError."""
        w1 = (bins + 4 - 3) // 3 + 1
        w2 = (w1 - 3) // 2 + 1 if w1 >= 3 else 0
        w3 = (w2 - 2) // 2 + 1 if w2 >= 2 else 0
        f1 = filters * w3
        f2 = (f1 - 8) // 8 + 1 if f1 >= 8 else 0
        f3 = (f2 - 4) // 2 + 1 if f2 >= 4 else 0
        if f3 < 1:
            raise ConfigError(f"model.name=fedmat: interval={interval} ({bins} frequency bins) and filters={filters} "
                              "are too small for the conv stack (it needs 11 bins, interval >= 20, and 32 filters; "
                              "FedMAT's code: 11 bins, 64 filters)")
        return filters * f3

    def features(self, x: Tensor) -> Tensor:
        """The shared network's embedding (pairwise loss, prototypes)."""
        return self.body(x).embedding

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))

    @torch.no_grad()
    def copy_shared_to_client(self) -> None:
        """Load the client's conv copies (with their BN statistics) and GRU from the shared
        network, as FedMAT's code does before stage 2 of each adaptation (``iLog_train.py``)."""
        for shared, own in zip(self.body.branches, self.head.branches, strict=True):
            own.convs.load_state_dict(shared.convs.state_dict())
        self.head.fusion.load_state_dict(self.body.fusion.state_dict())
        self.head.rnn.load_state_dict(self.body.rnn.state_dict())


__all__ = ["FedMAT", "FedMATOptions", "SharedOutput", "interleave_rows", "to_fusion", "to_sequence"]
