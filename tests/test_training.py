"""The training base: named optimiser states, the scheduler, the step hooks."""

from __future__ import annotations

import numpy as np
import torch

from fedwear.data import load_federated
from fedwear.methods import Record, Task, build_method
from fedwear.methods.training import LocalOptimizer
from tests.helpers import tiny_config


def test_scheduler_state_persists_and_resumes_the_schedule():
    p = [torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD(p, lr=1.0, momentum=0.9)
    local = LocalOptimizer("m", opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))
    for _ in range(5):
        p[0].grad = torch.ones(2)
        opt.step()
        local.end_epoch()
    arrays = local.state_arrays()
    assert int(arrays["optim.m.scheduler.last_epoch"]) == 5 and "optim.m.0.momentum_buffer" in arrays

    opt2 = torch.optim.SGD(p, lr=1.0, momentum=0.9)
    again = LocalOptimizer("m", opt2, torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5))
    again.load_state_arrays(arrays)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.25
    np.testing.assert_array_equal(opt2.state[p[0]]["momentum_buffer"], opt.state[p[0]]["momentum_buffer"])


def test_a_clients_schedule_continues_across_rounds():
    cfg = tiny_config(local_epochs=2, **{"optimizer.persist": True, "optimizer.scheduler": "step",
                                         "optimizer.step_size": 1, "optimizer.gamma": 0.5})
    data = load_federated(cfg.dataset, cfg.seed)
    m = build_method(Task.of(cfg, data))
    client = data.clients[0]
    down = m.configure(m.init_server(), client.client_id, 1)
    _, state = m.fit(down, Record(), client, 1, seed=1)
    assert int(state.arrays["optim.model.scheduler.last_epoch"]) == 2
    _, state = m.fit(down, state, client, 2, seed=2)
    assert int(state.arrays["optim.model.scheduler.last_epoch"]) == 4
    opt = m.optimizer(m.load(down, state), m.shared, state)
    assert opt.optimizer.param_groups[0]["lr"] == cfg.optimizer.lr * 0.5**4


def test_an_unscheduled_optimiser_holds_the_reached_rate_and_leaves_the_schedule():
    """Meta-HAR and FedReptile fine-tune with the user's optimiser but never step its scheduler
    (SPECS 2.4): the rate it has reached is held and the kept position is not touched."""
    cfg = tiny_config(local_epochs=2, **{"method": "fedreptile", "optimizer.name": "adam", "optimizer.persist": True,
                                         "optimizer.scheduler": "step", "optimizer.step_size": 1,
                                         "optimizer.gamma": 0.5})
    data = load_federated(cfg.dataset, cfg.seed)
    m = build_method(Task.of(cfg, data))
    client = data.clients[0]
    down = m.configure(m.init_server(), client.client_id, 1)
    _, state = m.fit(down, Record(), client, 1, seed=1)
    held = m.optimizer(m.load(down, state), m.shared, state, scheduled=False)
    assert held.scheduler is None and held.optimizer.param_groups[0]["lr"] == cfg.optimizer.lr * 0.5**2
    assert not any("scheduler" in k for k in held.state_arrays())
    kept = m.personalize(down, state, client, seed=3).keep
    assert int(kept.arrays["optim.model.scheduler.last_epoch"]) == 2  # three fine-tuning epochs later
    steps = [k for k in state.arrays if k.startswith("optim.model.") and k.endswith(".step")]
    for k in steps:  # the same Adam continued: 2 epochs of training, then 3 of fine-tuning
        assert float(kept.arrays[k]) == float(state.arrays[k]) * (2 + 3) / 2
    assert steps
