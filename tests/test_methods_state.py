"""No method object holds a client's state: a client's values travel in its ``Fit`` (or its state
``Record``), so one method object can serve every client in turn (``sim``), a round's clients at
once (``batched``), or a node (Flower)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedwear
from fedwear.methods import METHODS
from tests.helpers import PHASES, config_for

#: Attributes a fit may change: what the method measures over the run, and what it derives once.
RUN_WIDE = {"training_bytes", "vectorizable", "_max_together"}


def _value(x: object) -> object:
    """What identifies an attribute's value: scalars by value, containers by their items' identity."""
    if isinstance(x, (int, float, str, bool, type(None))):
        return x
    if isinstance(x, dict):
        return id(x), tuple((k, id(v)) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return id(x), tuple(id(v) for v in x)
    if isinstance(x, np.ndarray):
        return id(x), x.tobytes()
    return id(x)


def snapshot(method: object) -> dict[str, object]:
    return {k: _value(v) for k, v in vars(method).items() if k not in RUN_WIDE}


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["sim", "batched"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_no_method_object_holds_a_clients_state_between_its_hooks(tmp_path, monkeypatch, method, engine):
    cls = METHODS[method]
    checked = []
    for name in ("fit", "fit_many"):
        real = getattr(cls, name)

        def spied(self, *args, _real=real, _name=name, **kwargs):
            before = snapshot(self)
            out = _real(self, *args, **kwargs)
            after = snapshot(self)
            changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
            assert not changed, f"{method}.{_name} left {changed} on the method object"
            checked.append(_name)
            return out

        monkeypatch.setattr(cls, name, spied)
    torch.manual_seed(0)
    fedwear.run(config_for(method, engine=engine, **PHASES.get(method, {})), tmp_path)
    assert checked
