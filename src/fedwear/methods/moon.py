"""MOON (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021, Eq. 3-4).

FedAvg whose local objective (Eq. 4) adds a model-contrastive term (Eq. 3) pulling the local
representation z of a batch towards the global model's z_glob and away from the client's
previous local model's z_prev:

    l = CE(head(z), y) + mu * l_con,
    l_con = -log( exp(cos(z, z_glob)/tau) / (exp(cos(z, z_glob)/tau) + exp(cos(z, z_prev)/tau)) )

As in the authors' code (github.com/QinbinLi/MOON, ``ModelFedCon``), the network is base
encoder -> projection head (Linear, ReLU, Linear) -> output layer, and z is the projection;
here ``body`` = encoder + projection head, ``head`` = output layer. The previous model is the
client's model after its last local training (``prev.`` arrays of its state); a client that
has not trained yet uses the initial weights (the authors' code: its own untrained network).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedwear.methods.api import Options
from fedwear.methods.fedavg import PARTS, FedAvg
from fedwear.methods.training import model_arrays, reference_outputs, strip
from fedwear.models import SplitModel

PREV = "prev."


class MoonOptions(Options):
    mu: float = Field(
        1.0, ge=0, description="weight mu of the contrastive term (Eq. 4); MOON's code: --mu 1"
    )
    temperature: float = Field(
        0.5, gt=0, description="temperature tau (Eq. 3); MOON's code: --temperature 0.5"
    )
    projection_dim: int | None = Field(
        256, ge=1, description="output size of the projection head (MOON's code default --out_dim "
        "256); null: no projection head, z = the model's own body output",
    )


class Projected(SplitModel):
    """``body`` = the model's body + Linear(k, k), ReLU, Linear(k, dim); ``head`` = Linear(dim, Q)
    (MOON's ``ModelFedCon``: l1, ReLU, l2, then l3); k = the size of the model's body output."""

    def __init__(self, model: SplitModel, window: int, channels: int, dim: int,
                 num_classes: int) -> None:
        super().__init__()
        with torch.no_grad():
            probe = torch.zeros(2, window, channels, device=next(model.parameters()).device)
            k = model.eval().body(probe).shape[1]
        self.body = nn.Sequential(model.body, nn.Linear(k, k), nn.ReLU(), nn.Linear(k, dim))
        self.head = nn.Linear(dim, num_classes)
        self.train()


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor,
                     tau: float) -> torch.Tensor:
    """l_con (Eq. 3), the batch mean: cross-entropy with label 0 over the logits
    [cos(z, z_glob), cos(z, z_prev)] / tau."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=-1),
                          F.cosine_similarity(z, z_prev, dim=-1)], dim=1)
    return F.cross_entropy(logits / tau, torch.zeros(len(z), dtype=torch.long, device=z.device))


class Moon(FedAvg):
    name = "moon"
    summary = ("MOON (Li et al. 2021): FedAvg plus a contrastive term pulling representations "
               "towards the global model's, away from the previous local model's.")
    Options = MoonOptions

    def new_model(self) -> SplitModel:
        """The configured model with MOON's projection head, initialised from the run seed."""
        model = super().new_model()
        if self.options.projection_dim is None:
            return model
        with torch.random.fork_rng():
            torch.manual_seed(self.task.training.seed)
            t, dim = self.task, self.options.projection_dim
            return Projected(model, t.window, t.channels, dim, t.num_outputs).to(self.device)

    def prepare(self, fit):
        """This round's global model and the client's previous one (every weight and buffer)."""
        super().prepare(fit)
        prev = strip(fit.state.arrays, PREV)
        for name, arrays in (("global", fit.down.arrays), ("previous", prev)):
            fit.inputs[name] = {k: torch.from_numpy(np.array(arrays.get(k, a))).to(self.device)  # copies
                                for k, a in self.initial.items()}

    def loss(self, model, x, y, fit):
        z = model.body(x)
        z_glob, z_prev = (reference_outputs(model.body, strip(fit.inputs[name], "body."), x)
                          for name in ("global", "previous"))
        con = contrastive_loss(z, z_glob, z_prev, self.options.temperature)
        return self.criterion(model.head(z), y) + self.options.mu * con

    def client_state(self, fit):
        """FedAvg's, plus this round's trained model as the next round's previous model."""
        state = super().client_state(fit)
        state.arrays.update({PREV + k: v for k, v in model_arrays(fit.model, PARTS).items()})
        return state


__all__ = ["Moon", "contrastive_loss"]
