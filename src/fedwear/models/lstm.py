"""A small LSTM over time: PCFedH's phase-2 predictor (pcfedh/pcfedh ``models.py``).

PCFedH (Yin et al., FITEE 2025) predicts the next heart-rate value from the last 150 values
with ``LSTM(input=1, hidden=10, layers=1, batch_first)``, the output at the last time step and
``Linear(10, 1)`` (531 parameters). The head
maps to the task's outputs: one for a regression task (PCFedH's forecaster), one per class for
classification.

The body is ``torch.nn.LSTM``, not a hand-written cell loop: on one client (batch 64, 150
steps, hidden 10, one thread) a training step took 8.6 to 11.6 ms with ``nn.LSTM`` and 61 to
66 ms with an explicit loop over time steps, and both work under
``torch.func.vmap(torch.func.grad(...))`` over stacked client weights (``nn.LSTM`` through
torch's per-sample fallback; the explicit loop was slower there too: 90 vs 40 ms per client
for 8 clients). See docs/performance.md.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from fedwear.models.base import ModelOptions, SplitModel


class LSTMOptions(ModelOptions):
    hidden: int = Field(10, ge=1, description="LSTM hidden size (PCFedH's models.py: 10)")
    layers: int = Field(1, ge=1, description="stacked LSTM layers (PCFedH: 1)")


class _LastHidden(nn.Module):
    """``[B, T, C] -> [B, hidden]``: the top layer's output at the last time step."""

    def __init__(self, channels: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(channels, hidden, layers, batch_first=True)
        self.out_features = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return out[:, -1]


class LSTMNet(SplitModel):
    """``body`` = LSTM over time (last hidden state), ``head`` = Linear(hidden, num_classes).

    PCFedH's phase-2 model (``models.py``) with the defaults: hidden 10, one layer; PyTorch's
    default initialisation.
    """

    Options = LSTMOptions

    def __init__(self, window: int, channels: int, num_classes: int, hidden: int = 10,
                 layers: int = 1) -> None:
        super().__init__()
        self.body = _LastHidden(channels, hidden, layers)
        self.head = nn.Linear(hidden, num_classes)
