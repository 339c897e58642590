"""FedALA (Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated Learning",
AAAI 2023, section "Adaptive Local Aggregation (ALA)"): a PCFedH Table 2 baseline.

Each client keeps its whole model between rounds. When it receives the global model ``w_g`` it
initialises its local model by ALA instead of overwriting it:

* the lower layers (every parameter but the top ``layer_idx`` tensors, and every buffer) are
  taken from ``w_g`` as they are;
* each of the top ``layer_idx`` parameter tensors becomes ``w_hat = w_l + (w_g - w_l) * W``,
  with ``W`` element-wise weights in [0, 1] (initially ones) learnt on a part of the client's
  train split by ``W <- clip(W - eta * grad_{w_hat} L * (w_g - w_l), 0, 1)``, one update per
  mini-batch, ``L`` the task's loss (cross-entropy, or MSE for regression).

The first time a client learns ``W`` it repeats passes over that part until the population
std of the last ``loss_window`` pass losses is below ``threshold`` (at most ``max_ala_epochs``
passes); afterwards one pass per round. ``W`` stays on the client (``ala.<param>`` in its
state), with its model. Then FedAvg's local training from ``w_hat``; the reply is the whole
model and the server takes FedAvg's sample-weighted mean.

Choices where the method leaves room, each stated:

* The part of the data: ``rand_percent`` % of the train windows (at least one) as **one random
  contiguous slice**, run in order without shuffling, as the authors' ``ALA.py`` (TsingZ0/FedALA
  ``system/utils/ALA.py``) does it. For the forecasting datasets the windows are chronological, so the slice is one
  stretch of the client's recording; its start is drawn from ``derive_seed(seed, "ala")``.
* A pass's loss is the mean of its mini-batch losses (the authors' code records the loss of
  the pass's last batch, which can be a batch of one window); the stopping rule needs
  ``loss_window`` passes (the authors' code needs one more).
* When the received model equals the client's own in every top tensor (round one: every model
  starts from the run's one initialisation; a client that never trained keeps that
  initialisation as its local model) there is nothing to weigh: ``w_hat = w_g``, no ``W`` is
  learnt or kept, and the convergence phase happens the first time there is (the authors'
  code skips ALA likewise when its first parameter tensor is unchanged).
* The evaluated personal model is the client's model after its last local training; a client
  that has not trained yet uses the global model. New clients use the global model (FedAvg).

Defaults ``rand_percent=10, layer_idx=2, eta=0.1``: PCFedH's solver
(pcfedh/pcfedh ``solvers.py``); ``threshold=0.1`` and ``loss_window=10``: the authors' ``ALA.py`` defaults.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field
from torch import nn

from fedwear.methods.api import Options, Task
from fedwear.methods.fedavg import PARTS, FedAvg, tensors
from fedwear.methods.training import host, load_arrays
from fedwear.seeding import derive_seed

#: Prefix of the ALA weights in a client state (``ala.<parameter name>``).
ALA = "ala."


class FedALAOptions(Options):
    rand_percent: int = Field(
        10, gt=0, le=100,
        description="percent of the client's train windows (one random contiguous slice) that W is learnt on "
        "(PCFedH's solvers.py: 10)",
    )
    layer_idx: int = Field(
        2, ge=0,
        description="number of top parameter tensors aggregated with learnt weights W; the others are taken from "
        "the global model; 0: all of them (PCFedH's solvers.py: 2, i.e. the head's weight and bias)",
    )
    eta: float = Field(0.1, gt=0, description="learning rate of the weights W (PCFedH's solvers.py: 0.1)")
    threshold: float = Field(
        0.1, ge=0,
        description="first ALA: passes repeat until the std of the last loss_window pass losses is below this "
        "(FedALA's ALA.py: 0.1)",
    )
    loss_window: int = Field(10, ge=2, description="pass losses the stopping rule looks at (FedALA's ALA.py: 10)")
    max_ala_epochs: int = Field(
        100, ge=1,
        description="cap on the passes of the first ALA, so that it ends (not in FedALA, whose loop has no cap)",
    )


def ala_weight_step(weight: torch.Tensor, grad: torch.Tensor, local: torch.Tensor, glob: torch.Tensor,
                    eta: float) -> torch.Tensor:
    """One update of the ALA weights: ``clip(W - eta * grad * (w_g - w_l), 0, 1)``."""
    return torch.clamp(weight - eta * grad * (glob - local), 0.0, 1.0)


def ala_combine(local: torch.Tensor, glob: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The aggregated tensor ``w_l + (w_g - w_l) * W``."""
    return local + (glob - local) * weight


class FedALA(FedAvg):
    name = "fedala"
    summary = ("FedALA (Zhang et al. 2023): each client merges the global model into its own by learnt "
               "element-wise weights on the top layers (ALA), then trains; the server averages.")
    Options = FedALAOptions
    personal = PARTS  # the client's whole model stays with it between rounds (and wins in ``load``)

    def __init__(self, task: Task, options: FedALAOptions) -> None:
        super().__init__(task, options)
        self.opt: FedALAOptions = options

    def top_names(self, model: nn.Module) -> list[str]:
        """The parameter tensors aggregated with learnt weights: the last ``layer_idx``."""
        names = [n for n, _ in model.named_parameters()]
        k = self.opt.layer_idx
        return names if k == 0 or k >= len(names) else names[-k:]

    def ala_slice(self, n: int, seed: int) -> slice:
        """``rand_percent`` % of ``n`` windows (at least one), one contiguous stretch at a random start."""
        size = min(n, max(1, int(self.opt.rand_percent / 100 * n)))
        start = int(np.random.default_rng(derive_seed(seed, "ala")).integers(0, n - size + 1))
        return slice(start, start + size)

    def adaptive_local_aggregation(
        self, model: nn.Module, glob: dict[str, np.ndarray], local: dict[str, np.ndarray],
        weights: dict[str, np.ndarray] | None, x: torch.Tensor, y: torch.Tensor, first: bool,
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None, list[float]]:
        """ALA on ``(x, y)`` (the windows W is learnt on): the aggregated model's arrays, the
        new weights (None when there was nothing to weigh) and the loss of every pass.

        ``glob`` and ``local`` hold the model's state-dict arrays; ``weights`` the current W per
        top tensor (None: ones). ``model`` is used as scratch: it ends holding ``w_hat``."""
        top = self.top_names(model)
        start = dict(glob)
        if all(np.array_equal(glob[n], local[n]) for n in top):
            load_arrays(model, start)
            return start, weights, []
        g = {n: self.on_device(np.array(glob[n])) for n in top}
        lo = {n: self.on_device(np.array(local[n])) for n in top}
        w = {n: torch.ones_like(g[n]) if weights is None else self.on_device(np.array(weights[n])) for n in top}
        load_arrays(model, start)
        params = dict(model.named_parameters())
        lower = [p for n, p in params.items() if n not in top and p.requires_grad]
        for p in lower:  # no gradient is needed below the top tensors
            p.requires_grad_(False)
        losses: list[float] = []
        try:
            with torch.no_grad():
                for n in top:
                    params[n].copy_(ala_combine(lo[n], g[n], w[n]))
            model.train()
            while True:
                # float64 on the device, as Python's float sum: one copy to the host per pass
                total, batches = torch.zeros((), dtype=torch.float64, device=x.device), 0
                for i in range(0, len(y), self.batch_size):
                    model.zero_grad(set_to_none=True)
                    loss = self.criterion(model(x[i:i + self.batch_size]), y[i:i + self.batch_size])
                    loss.backward()
                    with torch.no_grad():
                        for n in top:
                            grad = params[n].grad
                            if grad is not None:  # a tensor the loss does not reach keeps its W
                                w[n] = ala_weight_step(w[n], grad, lo[n], g[n], self.opt.eta)
                            params[n].copy_(ala_combine(lo[n], g[n], w[n]))
                    total += loss.detach().double()
                    batches += 1
                losses.append(float(total) / max(batches, 1))
                if not first or len(losses) >= self.opt.max_ala_epochs:
                    break
                recent = losses[-self.opt.loss_window:]
                if len(recent) == self.opt.loss_window and float(np.std(recent)) < self.opt.threshold:
                    break
        finally:
            for p in lower:
                p.requires_grad_(True)
            model.zero_grad(set_to_none=True)
        merged = {**start, **{n: host(params[n]).copy() for n in top}}
        return merged, {n: host(w[n]).copy() for n in top}, losses

    def prepare(self, fit):
        """The client's model merged with the global one by ALA on a slice of its data."""
        down, state = fit.down, fit.state
        glob = {**self.initial, **{k: v for k, v in down.arrays.items() if k in self.initial}}
        local = {**self.initial, **{k: v for k, v in state.arrays.items() if k in self.initial}}
        weights = {k[len(ALA):]: v for k, v in state.arrays.items() if k.startswith(ALA)} or None
        x, y = tensors(fit.data)
        part = self.ala_slice(len(y), fit.seed)
        merged, fit.notes["ala"], _ = self.adaptive_local_aggregation(
            self.model, glob, local, weights, x[part].to(self.device), y[part].to(self.device), first=weights is None)
        load_arrays(self.model, merged)
        fit.model = self.model

    @property
    def trained_parts(self) -> tuple[str, ...]:
        return PARTS

    def client_state(self, fit):
        """FedAvg's, plus the ALA weights W the client learnt this round."""
        kept = super().client_state(fit)
        kept.arrays.update({ALA + n: a for n, a in (fit.notes["ala"] or {}).items()})
        return kept


__all__ = ["FedALA", "ala_combine", "ala_weight_step"]
