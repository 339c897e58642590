"""FedProx (Li et al., MLSys 2020, Eq. 2): FedAvg plus a proximal term (mu/2)||w - w_global||^2."""

from __future__ import annotations

from pydantic import Field

from fedwear.methods.api import Options
from fedwear.methods.fedavg import FedAvg
from fedwear.methods.proximal import Proximal


class FedProxOptions(Options):
    mu: float = Field(
        0.01, ge=0,
        description="proximal weight mu (Li et al. 2020, Eq. 2); 0.01 as in FedAli's paper for its FedProx baseline",
    )


class FedProx(FedAvg):
    name = "fedprox"
    summary = "FedProx (Li et al. 2020): FedAvg with a proximal term keeping local weights near the global ones."
    Options = FedProxOptions
    trains_together = True  # FedAvg's step plus the proximal term, which engine=batched adds too

    @property
    def proximal_weight(self) -> float:
        return self.options.mu

    def begin_fit(self, model, down, state):
        trained = [p for p in model.parameters() if p.requires_grad]
        self.proximal = Proximal(trained, [[p.detach().clone() for p in trained]], [1.0], self.options.mu)

    def loss(self, model, x, y):
        return super().loss(model, x, y) + self.proximal()


__all__ = ["FedProx"]
