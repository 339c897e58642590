"""The memory a method holds on a client for local training: FedAli's "memory footprint" (Ek et
al. 2024, Table 3: the model plus what each method keeps beside it, such as FedProx's copy of the
global model, MOON's global and previous models, FedAli's prototypes).

Measured, not declared: the bytes of the distinct tensor storages reachable from the method
object and the client's ``Fit`` while it trains (the models' parameters and buffers, the loss's
inputs: anchors, prototypes, targets, reference weights; gradient corrections). Not
counted: the data, optimiser state, gradients and activations, and numpy arrays (the engine's own
copies of weights and states between rounds).
"""

from __future__ import annotations

import torch
from torch import nn

#: How deep :func:`tensor_bytes` follows attributes and containers (a fit's loss inputs sit two or
#: three levels down: ``fit.inputs["anchor"]``, ``fit.inputs["global"][name]``).
MAX_DEPTH = 4
#: Method attributes that are not client training state (the task holds the config and data shapes).
SKIPPED = frozenset({"task", "options"})


def tensor_bytes(method: object, fit: object = None) -> int:
    """Bytes of the distinct tensor storages reachable from ``method``'s attributes and from the
    client's ``fit`` (:class:`fedwear.methods.fit.Fit`: the loss's inputs, the corrections)."""
    seen: set[int] = set()

    def visit(x: object, depth: int) -> int:
        if depth > MAX_DEPTH:
            return 0
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            if storage.data_ptr() in seen or storage.nbytes() == 0:
                return 0
            seen.add(storage.data_ptr())
            return storage.nbytes()
        if isinstance(x, nn.Module):
            return sum(visit(t, depth + 1) for t in x.state_dict(keep_vars=True).values())
        if isinstance(x, dict):
            return sum(visit(v, depth + 1) for v in x.values())
        if isinstance(x, list | tuple):
            return sum(visit(v, depth + 1) for v in x)
        module = type(x).__module__
        if module.startswith("fedwear.") and not module.startswith("fedwear.data") and hasattr(x, "__dict__"):
            return sum(visit(v, depth + 1) for v in vars(x).values())  # a helper object of fedwear's
        return 0

    held = sum(visit(v, 0) for k, v in vars(method).items() if k not in SKIPPED)
    return held + (visit(fit, 0) if fit is not None else 0)


__all__ = ["tensor_bytes"]
