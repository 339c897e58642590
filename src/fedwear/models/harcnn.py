"""HARCNN exactly as ProtoHAR's code (cheng-haha/ProtoHAR ``FLAlgorithms/trainmodel/cnnbase_fc.py``)."""

from __future__ import annotations

import torch
from pydantic import Field, PositiveInt
from torch import nn

from fedwear.models.base import ModelOptions, SplitModel

#: ``div`` per dataset window/channel shape from ProtoHAR's ``channel_list`` (``cnnbase_fc.py``).
KNOWN_DIV = {(512, 6): 20, (100, 9): 3}


class _Body(nn.Module):
    def __init__(self, window: int, channels: int, down: tuple[int, int], div: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, (9, 1)), nn.ReLU())
        self.conv1 = nn.Sequential(nn.Conv2d(16, 32, (9, 1)), nn.ReLU(), nn.MaxPool2d(down))
        self.conv2 = nn.Sequential(nn.Conv2d(32, 64, (9, 1)), nn.ReLU(), nn.MaxPool2d(down))
        with torch.no_grad():
            flat = self._conv(torch.zeros(1, window, channels)).shape[1]
        self.embedding = nn.Sequential(nn.Linear(flat, flat // div), nn.ReLU())
        self.out_features = flat // div
        self.to(memory_format=torch.channels_last)

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        # ProtoHAR feeds (B, 1, T, C): time is the image height, channels the width. Channels-last
        # tensors make the max-pools ~6x and a training step ~10% faster on CPU (the values
        # differ from NCHW's only by float rounding; benchmarks/protohar_round.py at commit e6cb47ba6e).
        h = x.unsqueeze(1).contiguous(memory_format=torch.channels_last)
        return self.conv2(self.conv1(self.stem(h))).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding(self._conv(x))


class HARCNNOptions(ModelOptions):
    down: tuple[PositiveInt, PositiveInt] = Field(
        (2, 2), description="max-pool size (time, channels); ProtoHAR's (2, 2) (cnnbase_fc.py)"
    )
    div: int | None = Field(
        None, ge=1, description="embedding = flattened conv features // div; null: from ProtoHAR's "
        "channel_list for known shapes, else chosen for an embedding near 384",
    )


class HARCNN(SplitModel):
    """Three (9,1) convolutions, two max-pools, a ReLU embedding (the prototype) and a linear head.

    Defaults follow ``cnnbase_fc.py``: ``down=(2, 2)``; ``div`` from ``KNOWN_DIV`` for USC-HAD (512x6:
    k=384) and HARBOX (100x9: k=725), otherwise chosen so the embedding lands near 384.
    PyTorch default initialisation; no normalisation or dropout layers.
    """

    Options = HARCNNOptions

    def __init__(
        self,
        window: int,
        channels: int,
        num_classes: int,
        down: tuple[int, int] = (2, 2),
        div: int | None = None,
    ) -> None:
        super().__init__()
        down = (down[0], min(down[1], max(1, channels // 2))) if channels < 4 else tuple(down)
        if div is None:
            div = KNOWN_DIV.get((window, channels))
        if div is None:
            with torch.no_grad():
                probe = _Body(window, channels, down, 1)
            div = max(1, round(probe.out_features / 384))
        self.body = _Body(window, channels, down, div)
        self.head = nn.Linear(self.body.out_features, num_classes)
