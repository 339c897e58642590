"""The proximal term ``(lam / 2) sum_k u_k ||w - w_k||^2`` of FedProx (Li et al. 2020, Eq. 2: one
centre, the global model) and of PCFedH and FedSoft (PCFedH Eq. 12: the K cluster models weighted
by the client's u_k)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


class Proximal:
    """``(lam / 2) sum_k u_k ||w - w_k||^2`` over ``params`` taken as one vector; its gradient is
    ``lam sum_k u_k (w - w_k)``.

    The centres are stacked once into a ``[K, P]`` matrix, so a step costs a handful of tensor
    operations however many parameter tensors and centres there are. Built tensor by tensor, the
    term is K x (parameter tensors) small operations and their backward: on PCFedH's LSTM(1 -> 10)
    step with K = 4, about twice this form's CPU and a quarter of the step
    (``benchmarks/step_overheads.py``, ``results/step_overheads.txt``).
    """

    def __init__(self, params: Sequence[torch.Tensor], centres: Sequence[Sequence[torch.Tensor]],
                 weights: Sequence[float], lam: float) -> None:
        self.params = list(params)
        device = self.params[0].device if self.params else None  # centres given on the host: moved once
        self.centres = torch.stack([flat(c).detach() for c in centres]).to(device)
        self.weights = torch.as_tensor(list(weights), dtype=self.centres.dtype, device=self.centres.device)
        self.lam = lam

    def __call__(self) -> torch.Tensor:
        squared = ((flat(self.params) - self.centres) ** 2).sum(dim=1)
        return 0.5 * self.lam * (self.weights @ squared)


__all__ = ["Proximal"]
