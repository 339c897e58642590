"""FedProx (Li et al., MLSys 2020, Eq. 2): FedAvg plus a proximal term (mu/2)||w - w_global||^2."""

from __future__ import annotations

import torch
from pydantic import Field

from fedwear.methods.api import Options
from fedwear.methods.fedavg import FedAvg
from fedwear.methods.proximal import centres, proximal


class FedProxOptions(Options):
    mu: float = Field(
        0.01, ge=0,
        description="proximal weight mu (Li et al. 2020, Eq. 2); 0.01 as in FedAli's paper for its FedProx baseline",
    )


class FedProx(FedAvg):
    name = "fedprox"
    summary = "FedProx (Li et al. 2020): FedAvg with a proximal term keeping local weights near the global ones."
    Options = FedProxOptions

    def prepare(self, fit):
        """w_global, the model as received, is the anchor."""
        super().prepare(fit)
        anchor = centres([list(fit.model.parameters())])
        fit.inputs.update(anchor=anchor, anchor_weight=torch.ones(1, dtype=anchor.dtype, device=anchor.device))

    def loss(self, model, x, y, fit):
        return super().loss(model, x, y, fit) + proximal(
            list(model.parameters()), fit.inputs["anchor"], fit.inputs["anchor_weight"], self.options.mu)


__all__ = ["FedProx"]
