"""The client-batched engine: clients trained together give what training them one by one gives."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fedwear
from fedwear.callbacks import CHECKPOINT, load_checkpoint
from fedwear.methods import METHODS, build_method, together
from fedwear.methods.api import Record, Task, Training
from fedwear.methods.fit import Fit, Stage
from fedwear.methods.proximal import centres, proximal
from fedwear.methods.together import SGD, Client, train_together
from fedwear.methods.training import train_epochs
from fedwear.models import build_model
from tests.helpers import PHASES, config_for, tiny_config, tiny_regression_config

SGD_SETTINGS = {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}


def _loss(mu: float):
    """Cross-entropy plus FedProx's term toward ``fit.inputs["anchor"]`` (weight ``mu``)."""
    def loss(model, x, y, fit):
        out = F.cross_entropy(model(x), y)
        if mu:
            out = out + proximal(list(model.parameters()), fit.inputs["anchor"], fit.inputs["weight"], mu)
        return out
    return loss


def _alone(model, client: Client, epochs: int, batch_size: int, clip: float | None, mu: float):
    """One client trained by the plain loop with torch's SGD."""
    m = copy.deepcopy(model)
    m.load_state_dict(client.weights)
    opt = torch.optim.SGD(m.parameters(), **SGD_SETTINGS)
    if client.momentum is not None:
        for p, n in zip(m.parameters(), client.weights, strict=True):
            opt.state[p]["momentum_buffer"] = client.momentum[n].clone()
    loss = train_epochs(m, opt, client.x, client.y, epochs=epochs, batch_size=batch_size,
                        generator=torch.Generator().manual_seed(client.seed), clip=clip,
                        loss_fn=lambda mm, x, y: _loss(mu)(mm, x, y, client.fit))
    return {n: p.detach() for n, p in m.named_parameters()}, {n: opt.state[p]["momentum_buffer"] for n, p in m.named_parameters()}, loss


@pytest.mark.parametrize("clip, mu", [(None, 0.0), (0.5, 0.0), (None, 0.1)])
@pytest.mark.slow
def test_clients_trained_together_equal_clients_trained_alone(one_thread, clip, mu):
    torch.manual_seed(0)
    model = build_model("cnn", 32, 3, 4, width=8)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    clients = []
    for k, n in enumerate([37, 8, 20, 3]):  # partial last batches, clients with fewer steps than others
        x, y = torch.randn(n, 32, 3), torch.randint(0, 4, (n,))
        weights = {name: w + 0.01 * k for name, w in start.items()}
        momentum = {name: torch.randn_like(w) * 0.1 for name, w in start.items()} if k == 2 else None
        fit = Fit(Record(), Record(), None, 100 + k, inputs={"anchor": centres([list(weights.values())]),
                                                             "weight": torch.ones(1)})
        clients.append(Client(fit, weights, x, y, 100 + k, momentum))
    stage = Stage("model", ("body", "head"), _loss(mu), 3)
    trained = train_together(model, stage, clients, SGD(clip=clip, batch_size=8, **SGD_SETTINGS))
    for client, res in zip(clients, trained, strict=True):
        weights, momentum, loss = _alone(model, client, 3, 8, clip, mu)
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
    real = together.train_together
    monkeypatch.setattr(together, "train_together", lambda *a, **k: calls.append(1) or real(*a, **k))
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


def _vectorised(method: str) -> bool:
    cfg = config_for(method, **PHASES.get(method, {}))
    return build_method(Task(Training.of(cfg), 32, 3, 3, 6)).vectorizable


#: The methods that train together on their golden config (tests/test_golden.py).
TOGETHER = ["centralized", "fedala", "fedavg", "fedce", "fedhome", "fedper", "fedproto", "fedprox", "fedrep",
            "fedreptile", "ifca", "lgfedavg", "local", "moon", "protohar", "scaffold"]


@pytest.mark.slow
def test_the_methods_that_train_together_are_those_listed():
    assert sorted(m for m in METHODS if _vectorised(m)) == TOGETHER


@pytest.mark.parametrize("method, sets, config", [
    *[(m, PHASES.get(m, {}), config_for) for m in TOGETHER],
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
def test_clients_trained_together_equal_fit(tmp_path, monkeypatch, method, sets, config):
    """Every round of a batched run, each client's reply and kept state from ``fit_many`` (its
    stages trained together) equal what ``fit`` gives on the same inputs, up to float rounding.
    (Whole runs drift apart further: a rounding difference can flip a max-pool's choice, and
    later rounds amplify it.)"""
    assert_trained_together_equals_fit(tmp_path, monkeypatch, method, sets, config)


def assert_trained_together_equals_fit(tmp_path, monkeypatch, method, sets, config, atol=1e-6):
    """``fit_many`` against ``fit`` on the same inputs, every round of a batched run
    (``tests/test_gpu.py`` runs it on cuda)."""
    probe = build_method(Task(Training.of(config(method=method, **sets)), 32, 3, 3, 6))
    assert probe.vectorizable, f"{method} does not train together with {sets}"
    cls = type(probe)
    real, checked = cls.fit_many, []

    def compared(self, jobs, round):
        out = real(self, jobs, round)
        for (down, state, data, seed), (up, kept) in zip(jobs, out, strict=True):
            want_up, want_kept = self.fit(down, state, data, round, seed)
            for got, want in ((up, want_up), (kept, want_kept)):
                assert got.arrays.keys() == want.arrays.keys()
                for k in want.arrays:
                    np.testing.assert_allclose(got.arrays[k], want.arrays[k], atol=atol, rtol=1e-5, err_msg=k)
                assert got.scalars.keys() == want.scalars.keys()
            assert up.scalars["loss"] == pytest.approx(want_up.scalars["loss"], rel=1e-6, nan_ok=True)
            checked.append(bool(state.arrays))
        return out

    monkeypatch.setattr(cls, "fit_many", compared)
    cfg = config(method=method, engine="batched", **sets)
    fedwear.run(cfg, tmp_path)
    assert len(checked) >= cfg.rounds  # every round's clients
    assert any(checked) or not sets.get("optimizer.persist")  # some from a kept state


def test_only_declared_steps_on_small_models_are_vectorised():
    def method(name, **sets):
        cfg = tiny_config(method=name, **sets)
        return build_method(Task(Training.of(cfg), 32, 3, 3, 6))
    assert method("fedavg").vectorizable and method("local").vectorizable and method("fedper").vectorizable
    assert method("fedprox").vectorizable  # FedAvg's step plus the proximal term train_together adds
    assert method("scaffold").vectorizable
    assert method("moon").vectorizable and method("fedhome").vectorizable  # FedHome: its FedAvg phase
    assert method("fedrep").vectorizable and method("protohar").vectorizable and method("fedproto").vectorizable
    assert not method("fedpcl").vectorizable  # its loss branches on whether a prototype is known
    assert not method("fedavg", **{"optimizer.name": "adam"}).vectorizable
    assert not method("fedavg", **{"model.name": "lstm", "model.options": {}}).vectorizable  # vmap falls back
    cfg = tiny_config(**{"model.name": "harcnn", "model.options": {}})
    assert not build_method(Task(Training.of(cfg), 512, 6, 12, 14)).vectorizable  # compute-bound: no gain
