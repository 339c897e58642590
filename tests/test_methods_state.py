"""Two properties of every method's training, checked on one run per method and engine:

- no method object holds a client's state: a client's values travel in its ``Fit`` (or its state
  ``Record``), so one method object can serve every client in turn (``sim``), a round's clients
  at once (``batched``), or a node (Flower);
- no training step waits for the device: every step runs under
  :class:`~fedwear.methods.host_sync.HostSyncGuard`, which fails on a host synchronisation (on
  cuda, ``tests/test_gpu.py`` uses torch's sync debug mode)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedwear
from fedwear.methods import METHODS
from fedwear.methods.host_sync import STEP_GUARD, HostSync, HostSyncGuard
from fedwear.methods.training import train_epochs
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
def test_no_method_holds_a_clients_state_and_no_training_step_waits_for_the_device(tmp_path, monkeypatch,
                                                                                  method, engine):
    cls = METHODS[method]
    guarded = []

    def guard():
        guarded.append(1)
        return HostSyncGuard()

    token = STEP_GUARD.set(guard)
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
    try:
        fedwear.run(config_for(method, engine=engine, **PHASES.get(method, {})), tmp_path)
    finally:
        STEP_GUARD.reset(token)
    assert checked and guarded


def _steps(loss) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    train_epochs(model, opt, x, y, epochs=1, batch_size=4, generator=torch.Generator().manual_seed(0), loss_fn=loss)


def test_the_guard_fails_on_a_host_synchronisation_in_a_step():
    def ce(m, x, y):
        return torch.nn.functional.cross_entropy(m(x), y)

    token = STEP_GUARD.set(HostSyncGuard)
    try:
        _steps(ce)  # a step that reads nothing back
        for reads in (lambda out: out.item(), lambda out: bool(out > 0), lambda out: out.tolist(),
                      lambda out: out[out > 0], lambda out: out.nonzero()):
            with pytest.raises(HostSync):
                _steps(lambda m, x, y, reads=reads: reads(ce(m, x, y)) and ce(m, x, y))
    finally:
        STEP_GUARD.reset(token)
    _steps(lambda m, x, y: ce(m, x, y) + 0 * ce(m, x, y).item())  # without the guard: no check, no cost
