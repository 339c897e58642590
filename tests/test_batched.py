"""The client-batched engine: clients trained together give what training them one by one gives."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fedwear
from fedwear.callbacks import CHECKPOINT, load_checkpoint
from fedwear.methods import batched, build_method
from fedwear.methods.api import Task, Training
from fedwear.methods.batched import ClientJob, train_together
from fedwear.methods.training import train_epochs
from fedwear.models import build_model
from tests.helpers import tiny_config, tiny_regression_config

SGD = {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}


def _alone(model, job: ClientJob, epochs: int, batch_size: int, clip: float | None, mu: float = 0.0):
    """One client trained by the plain loop with torch's SGD (and FedProx's term with ``mu``)."""
    m = copy.deepcopy(model)
    m.load_state_dict(job.weights)
    start = [p.detach().clone() for p in m.parameters()]
    opt = torch.optim.SGD(m.parameters(), **SGD)
    if job.momentum is not None:
        opt.state_dict()  # materialise, then give each parameter its persisted buffer
        for p, n in zip(m.parameters(), job.weights, strict=True):
            opt.state[p]["momentum_buffer"] = job.momentum[n].clone()
    loss = train_epochs(m, opt, job.x, job.y, epochs=epochs, batch_size=batch_size,
                        generator=torch.Generator().manual_seed(job.seed), clip=clip,
                        loss_fn=lambda mm, x, y: F.cross_entropy(mm(x), y) + 0.5 * mu * sum(
                            ((p - s0) ** 2).sum() for p, s0 in zip(mm.parameters(), start, strict=True)))
    return {n: p.detach() for n, p in m.named_parameters()}, {n: opt.state[p]["momentum_buffer"] for n, p in m.named_parameters()}, loss


@pytest.mark.parametrize("clip, mu", [(None, 0.0), (0.5, 0.0), (None, 0.1)])
@pytest.mark.slow
def test_clients_trained_together_equal_clients_trained_alone(one_thread, clip, mu):
    torch.manual_seed(0)
    model = build_model("cnn", 32, 3, 4, width=8)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    jobs = []
    for k, n in enumerate([37, 8, 20, 3]):  # partial last batches, clients with fewer steps than others
        x, y = torch.randn(n, 32, 3), torch.randint(0, 4, (n,))
        weights = {name: w + 0.01 * k for name, w in start.items()}
        momentum = {name: torch.randn_like(w) * 0.1 for name, w in start.items()} if k == 2 else None
        jobs.append(ClientJob(weights, x, y, seed=100 + k, momentum=momentum))
    together = train_together(model, jobs, epochs=3, batch_size=8, clip=clip, proximal=mu, **SGD)
    for job, res in zip(jobs, together, strict=True):
        weights, momentum, loss = _alone(model, job, 3, 8, clip, mu)
        for n in weights:
            torch.testing.assert_close(res.weights[n], weights[n], atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(res.momentum[n], momentum[n], atol=2e-5, rtol=1e-4)
        assert res.loss == pytest.approx(loss, rel=1e-5)


PERSIST = {"optimizer.persist": True, "optimizer.momentum": 0.9}


@pytest.mark.parametrize("method, sets", [
    ("fedavg", {"optimizer.persist": True, "grad_clip": 1.0, "optimizer.momentum": 0.9}),
    ("local", {}),
    ("fedper", {"optimizer.weight_decay": 1e-3}),
    pytest.param("fedavg", {"privacy.dp": "central", "privacy.noise_multiplier": 0.1, "privacy.clipping_norm": 1.0},
                 marks=pytest.mark.extra("flower")),  # central DP uses Flower's noise and clipping functions
    ("fedprox", {"method_options.fedprox.mu": 0.5}),  # FedAvg's step plus the proximal term
    ("fedrep", {"method_options.fedrep.head_lr": 0.01}),  # head step, then body step
    ("protohar", {"grad_clip": 1.0}),  # the prototype pull, first embeddings recorded
    ("fedproto", {}),  # the prototype pull, the last epoch's embeddings
    ("moon", {}),  # the model-contrastive term
    ("scaffold", {}),  # gradients corrected by each client's c - c_i
])
def test_batched_engine_equals_sim(tmp_path, monkeypatch, method, sets):
    calls = []
    real = batched.train_together
    monkeypatch.setattr(batched, "train_together", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = tiny_config(method=method, **sets)
    sim = fedwear.run(cfg, tmp_path / "sim")
    assert not calls
    fast = fedwear.run(cfg.model_copy(update={"engine": "batched"}), tmp_path / "batched")
    steps = {"fedrep": 2, "protohar": 2}.get(method, 1)  # FedRep's, ProtoHAR's: head, body
    assert len(calls) == steps * cfg.rounds
    a, b = sim.metrics, fast.metrics
    assert a[["round", "client", "view", "split", "n"]].equals(b[["round", "client", "view", "split", "n"]])
    for m in ("accuracy", "macro_f1", "auc"):
        np.testing.assert_allclose(a[m], b[m], atol=1e-3)
    ca, cb = (load_checkpoint(r.out_dir / CHECKPOINT) for r in (sim, fast))
    records = [(ca["server"], cb["server"])] + [(ca["clients"][c], cb["clients"][c]) for c in ca["clients"]]
    assert sum(len(x.arrays) for x, _ in records) > 0
    for x, y in records:
        assert x.arrays.keys() == y.arrays.keys()
        for k in x.arrays:
            np.testing.assert_allclose(y.arrays[k], x.arrays[k], atol=1e-4, rtol=1e-3, err_msg=k)


@pytest.mark.parametrize("method, sets, config", [
    ("fedavg", PERSIST, tiny_config),
    ("fedprox", {"method_options.fedprox.mu": 0.5, **PERSIST}, tiny_config),
    ("fedrep", {**PERSIST, "method_options.fedrep.head_lr": 0.01}, tiny_config),
    ("protohar", {**PERSIST, "grad_clip": 1.0}, tiny_config),  # code variant: first embeddings
    ("protohar", {"method_options.protohar.variant": "paper", "method_options.protohar.distance": "cosine"}, tiny_config),
    ("protohar", {"method_options.protohar.reweight": 5.0, **PERSIST}, tiny_config),  # Eq. 5
    ("protohar", {"method_options.protohar.head_epochs": 0, **PERSIST}, tiny_config),  # no head buffers kept
    ("protohar", {"method_options.protohar.distance": "l1", "evaluation.personal_model": "trained"}, tiny_config),
    ("scaffold", PERSIST, tiny_config),
    ("scaffold", {"grad_clip": 0.5, "optimizer.weight_decay": 1e-3}, tiny_config),
    ("moon", PERSIST, tiny_config),
    ("moon", {"method_options.moon.projection_dim": "null", "method_options.moon.temperature": 0.1}, tiny_config),
    ("fedhome", {**PERSIST, "method_options.fedhome.personal_rounds": 1}, tiny_config),  # FedAvg's phase only
    ("fedproto", PERSIST, tiny_config),  # last epoch's embeddings per class
    ("fedproto", {"model.name": "cnn", "model.options": {"width": 8}, "optimizer.name": "sgd"},
     tiny_regression_config),  # per target bin
])
@pytest.mark.slow
def test_fit_together_equals_fit(tmp_path, monkeypatch, method, sets, config):
    """Every round of a batched run, each client's reply and kept state from ``fit_together``
    equal what ``fit`` gives on the same inputs, up to float rounding. (Whole runs drift apart
    further: a rounding difference can flip a max-pool's choice, and later rounds amplify it.)"""
    assert_fit_together_equals_fit(tmp_path, monkeypatch, method, sets, config)


def assert_fit_together_equals_fit(tmp_path, monkeypatch, method, sets, config, atol=1e-6):
    """``fit_together`` against ``fit`` on the same inputs, every round of a batched run
    (``tests/test_gpu.py`` runs it on cuda)."""
    cls = type(build_method(Task(Training.of(config(method=method, **sets)), 32, 3, 3, 6)))
    real, checked = cls.fit_together, []

    def compared(self, jobs):
        out = real(self, jobs)
        for (down, state, data, seed), (up, kept) in zip(jobs, out, strict=True):
            want_up, want_kept = self.fit(down, state, data, 0, seed)
            for got, want in ((up, want_up), (kept, want_kept)):
                assert got.arrays.keys() == want.arrays.keys()
                for k in want.arrays:
                    np.testing.assert_allclose(got.arrays[k], want.arrays[k], atol=atol, rtol=1e-5, err_msg=k)
            assert up.scalars["loss"] == pytest.approx(want_up.scalars["loss"], rel=1e-6)
            checked.append(bool(state.arrays))
        return out

    monkeypatch.setattr(cls, "fit_together", compared)
    fedwear.run(config(method=method, engine="batched", **sets), tmp_path)
    rounds = sum(1 for r in range(1, 4) if not (method == "fedhome" and r == 3))  # FedHome's last: heads
    assert len(checked) == 3 * rounds and any(checked)  # every fit trained together, some from a kept state


def test_only_declared_steps_on_small_models_are_vectorised():
    def method(name, **sets):
        cfg = tiny_config(method=name, **sets)
        return build_method(Task(Training.of(cfg), 32, 3, 3, 6))
    assert method("fedavg").vectorizable and method("local").vectorizable and method("fedper").vectorizable
    assert method("fedprox").vectorizable  # FedAvg's step plus the proximal term train_together adds
    assert method("scaffold").vectorizable
    assert method("moon").vectorizable and method("fedhome").vectorizable  # FedHome: its FedAvg phase
    assert method("fedrep").vectorizable and method("protohar").vectorizable and method("fedproto").vectorizable
    assert not method("fedpcl").vectorizable  # own step, no fit_together
    assert not method("fedavg", **{"optimizer.name": "adam"}).vectorizable
    assert not method("fedavg", **{"model.name": "lstm", "model.options": {}}).vectorizable  # vmap falls back
    cfg = tiny_config(**{"model.name": "harcnn", "model.options": {}})
    assert not build_method(Task(Training.of(cfg), 512, 6, 12, 14)).vectorizable  # compute-bound: no gain
