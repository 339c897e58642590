"""A small 1-D CNN: the fast default for tests and quick experiments."""

from __future__ import annotations

from pydantic import Field
from torch import nn

from fedwear.models.base import ModelOptions, SplitModel


class SmallCNNOptions(ModelOptions):
    width: int = Field(32, ge=1, description="channels of the first convolution (the second has 2x)")


class SmallCNN(SplitModel):
    """Conv1d(C->32,k5)-ReLU-MaxPool2 -> Conv1d(32->64,k5)-ReLU -> global average pool -> Linear."""

    Options = SmallCNNOptions

    def __init__(self, window: int, channels: int, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _ChannelsFirst(),
            nn.Conv1d(channels, width, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(width, 2 * width, 5, padding=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(2 * width, num_classes)


class _ChannelsFirst(nn.Module):
    def forward(self, x):  # [B, T, C] -> [B, C, T]
        return x.transpose(1, 2)
