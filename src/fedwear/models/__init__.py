"""Models with named parts: ``body`` (representation) and ``head`` (classifier).

Every model maps ``x: [B, T, C]`` to logits ``[B, Q]`` and exposes ``features(x)`` (the
body's output), so partial sharing (FedPer, FedRep, LG-FedAvg, ProtoHAR) is a declaration
of which part is sent, not a rewrite.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from fedwear.errors import ConfigError
from fedwear.models.base import SplitModel
from fedwear.models.cnn import SmallCNN
from fedwear.models.harcnn import HARCNN

MODELS: dict[str, Callable[..., SplitModel]] = {"harcnn": HARCNN, "cnn": SmallCNN}


def build_model(name: str, window: int, channels: int, num_classes: int, **options) -> SplitModel:
    """Build a registered model for inputs ``[B, window, channels]``."""
    if name not in MODELS:
        raise ConfigError(f"model: unknown model {name!r}; choose one of {sorted(MODELS)}")
    try:
        return MODELS[name](window=window, channels=channels, num_classes=num_classes, **options)
    except TypeError as e:
        raise ConfigError(f"model_options: {e}") from None


__all__ = ["MODELS", "SplitModel", "build_model", "nn"]
