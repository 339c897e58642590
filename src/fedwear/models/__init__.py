"""Models with named parts: ``body`` (representation) and ``head`` (classifier).

Every model maps ``x: [B, T, C]`` to logits ``[B, Q]`` and exposes ``features(x)`` (the
body's output), so partial sharing (FedPer, FedRep, LG-FedAvg, ProtoHAR) is a declaration
of which part is sent, not a rewrite. Each model class declares its ``Options`` (a pydantic
model), so ``model.options`` is validated per model when a config is loaded.
"""

from __future__ import annotations

import torch

from fedwear.errors import ConfigError, validate_options
from fedwear.models.base import ModelOptions, SplitModel
from fedwear.models.cnn import SmallCNN
from fedwear.models.deepsense import DeepSense
from fedwear.models.fedmat import FedMAT
from fedwear.models.harcnn import HARCNN
from fedwear.models.hart import HART
from fedwear.models.lstm import LSTMNet

MODELS: dict[str, type[SplitModel]] = {"harcnn": HARCNN, "cnn": SmallCNN, "lstm": LSTMNet, "hart": HART}
MODELS["deepsense"] = DeepSense  # Meta-HAR's embedding network (Chain123/Meta-HAR har_model.py)
MODELS["fedmat"] = FedMAT  # FedMAT's shared and client networks (Super-Shen/FedMAT iLog_models.py)


def model_class(name: str) -> type[SplitModel]:
    if name not in MODELS:
        raise ConfigError(f"model.name: unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    return MODELS[name]


def parse_model_options(name: str, raw: dict | None) -> ModelOptions:
    """Validate ``model.options`` against the model's Options; one-line ConfigError otherwise."""
    return validate_options(model_class(name).Options, raw, "model.options", name)


def build_model(name: str, window: int, channels: int, num_classes: int, **options) -> SplitModel:
    """Build a registered model for inputs ``[B, window, channels]`` and check that it runs on
    them (a model too deep for the window is a config error, not a traceback)."""
    opts = parse_model_options(name, options)
    try:
        model = MODELS[name](window=window, channels=channels, num_classes=num_classes, **dict(opts))
        with torch.no_grad():
            out = model.eval()(torch.zeros(2, window, channels))
    except RuntimeError as e:
        raise ConfigError(
            f"model.name={name} cannot take windows of {window} samples x {channels} channels "
            f"({str(e).splitlines()[0][:120]}): raise dataset.window or choose another model"
        ) from None
    if tuple(out.shape) != (2, num_classes):
        raise ConfigError(f"model.name={name} gives outputs {tuple(out.shape)}, expected (2, {num_classes})")
    return model.train()


__all__ = ["MODELS", "ModelOptions", "SplitModel", "build_model", "model_class", "parse_model_options"]
