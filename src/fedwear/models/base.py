from __future__ import annotations

import torch
from torch import nn


class SplitModel(nn.Module):
    """``forward(x) = head(body(x))``; parameters are named ``body.*`` and ``head.*``."""

    body: nn.Module
    head: nn.Module

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))
