"""The proximal term ``(lam / 2) sum_k u_k ||w - w_k||^2`` of FedProx (Li et al. 2020, Eq. 2: one
centre, the global model) and of PCFedH and FedSoft (PCFedH Eq. 12: the K cluster models weighted
by the client's u_k)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def centres(models: Sequence[Sequence[torch.Tensor]], device: torch.device | str | None = None) -> torch.Tensor:
    """The centres ``w_k`` as one ``[K, P]`` matrix (detached), on ``device``."""
    stacked = torch.stack([flat(c).detach() for c in models])
    return stacked if device is None else stacked.to(device)


def proximal(params: Sequence[torch.Tensor], centres: torch.Tensor, weights: torch.Tensor, lam: float) -> torch.Tensor:
    """``(lam / 2) sum_k u_k ||w - w_k||^2`` over ``params`` taken as one vector (``centres``
    ``[K, P]``, ``weights`` the ``[K]`` u_k); its gradient is ``lam sum_k u_k (w - w_k)``.

    A handful of tensor operations however many parameter tensors and centres there are. Built
    tensor by tensor, the term is K x (parameter tensors) small operations and their backward: on
    PCFedH's LSTM(1 -> 10) step with K = 4, about twice this form's CPU and a quarter of the step
    (``benchmarks/step_overheads.py``, ``results/step_overheads.txt``)."""
    squared = ((flat(params) - centres) ** 2).sum(dim=1)
    return 0.5 * lam * (weights @ squared)


__all__ = ["centres", "flat", "proximal"]
