"""FedRep (Collins et al. 2021) and ProtoHAR's two steps: the head step trains only the head,
the body step only the body, two optimiser states kept apart; FedPer and LG-FedAvg send only
their shared part."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedwear
from fedwear.data import load_federated
from fedwear.methods import Record, Task, build_method
from fedwear.methods.prototypes import COUNT, PROTO
from fedwear.methods.training import model_arrays, part_parameters
from tests.helpers import tiny_config

HEAD = {"head.weight", "head.bias"}


pytestmark = pytest.mark.usefixtures("one_thread")


def setup(method, **overrides):
    cfg = tiny_config(method=method, **overrides)
    data = load_federated(cfg.dataset, cfg.seed)
    return build_method(Task.of(cfg, data)), data


def first_down(m):
    """The server's first message, with the initial weights (``init_server`` reads the method's
    one model object, which a previous ``fit`` trained)."""
    down = m.configure(m.init_server(), "s01", 1)
    down.arrays.update({k: v.copy() for k, v in m.initial.items() if k in down.arrays})
    return down


def weights(model, part):
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith(part + ".")}


def changed(before, after):
    return {k for k in before if not torch.equal(before[k], after[k])}


# ---- 4. freezing -----------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fedrep", "protohar"])
def test_head_step_trains_only_the_head_and_body_step_only_the_body(monkeypatch, method):
    m, data = setup(method, **{f"method_options.{method}.head_epochs": 2})
    calls = []
    original = m.train

    def spy(model, opt, *args, **kwargs):
        trainable = {n.split(".")[0] for n, p in model.named_parameters() if p.requires_grad}
        in_opt = {id(p) for g in opt.optimizer.param_groups for p in g["params"]}
        parts = {n.split(".")[0] for n, p in model.named_parameters() if id(p) in in_opt}
        before = {part: weights(model, part) for part in ("body", "head")}
        loss = original(model, opt, *args, **kwargs)
        moved = {part: changed(before[part], weights(model, part)) for part in ("body", "head")}
        calls.append((opt.name, trainable, parts, kwargs.get("epochs"), moved))
        return loss

    monkeypatch.setattr(m, "train", spy)
    up, kept = m.fit(first_down(m), Record(), data.clients[0], 1, seed=2)
    assert [c[0] for c in calls] == ["head", "body"]
    (_, head_grad, head_opt, head_epochs, head_moved), (_, body_grad, body_opt, body_epochs, body_moved) = calls
    assert head_grad == head_opt == {"head"} and head_epochs == 2  # the body is frozen
    assert body_grad == body_opt == {"body"} and body_epochs == m.local_epochs
    assert not head_moved["body"] and head_moved["head"] == HEAD
    assert not body_moved["head"] and body_moved["body"] == {k for k in m.initial if k.startswith("body.")}
    assert all(p.requires_grad for p in m.model.parameters())  # unfrozen afterwards
    extra = {PROTO, COUNT} if method == "protohar" else set()
    assert set(up.arrays) == {k for k in m.initial if k.startswith("body.")} | extra
    assert set(kept.arrays) == HEAD  # the head stays on the client
    np.testing.assert_array_equal(kept.arrays["head.weight"], m.model.head.weight.detach().numpy())


# ---- 5. two optimiser states -------------------------------------------------------------------
def momenta(state, name):
    return {k: v for k, v in state.arrays.items() if k.startswith(f"optim.{name}.")}


@pytest.mark.parametrize("method", ["fedrep", "protohar"])
def test_head_and_body_optimiser_states_persist_apart(method):
    m, data = setup(method, **{"optimizer.persist": True, f"method_options.{method}.head_epochs": 1})
    client = data.clients[0]
    down = first_down(m)
    _, state = m.fit(down, Record(), client, 1, seed=2)
    assert {k.split(".")[0] for k in state.arrays} == {"head", "optim"}
    for part in ("head", "body"):
        shapes = [tuple(p.shape) for p in part_parameters(m.model, (part,))]
        buffers = momenta(state, part)
        assert sorted(buffers) == sorted(f"optim.{part}.{i}.momentum_buffer" for i in range(len(shapes)))
        for i, shape in enumerate(shapes):
            assert buffers[f"optim.{part}.{i}.momentum_buffer"].shape == shape

    def second(state):
        _, after = m.fit(down, state, client, 2, seed=4)
        return momenta(after, "head"), momenta(after, "body")

    head, body = second(state)
    without = {k: v for k, v in state.arrays.items() if not k.startswith("optim.")}
    fresh_head, fresh_body = second(Record(without))
    assert all(not np.allclose(head[k], fresh_head[k]) for k in head)  # both restored
    assert all(not np.allclose(body[k], fresh_body[k]) for k in body)
    # Each from its own entries: without the body's, the head step (which comes first) is the same.
    no_body = {k: v for k, v in state.arrays.items() if not k.startswith("optim.body.")}
    head2, body2 = second(Record(no_body))
    assert all(np.array_equal(head[k], head2[k]) for k in head)
    assert all(not np.allclose(body[k], body2[k]) for k in body)
    no_head = {k: v for k, v in state.arrays.items() if not k.startswith("optim.head.")}
    head3, _ = second(Record(no_head))
    assert all(not np.allclose(head[k], head3[k]) for k in head)


# ---- 8. FedPer and LG-FedAvg: only the shared part crosses the network -------------------------
BODY_BYTES = 4 * (8 * 3 * 5 + 8 + 16 * 8 * 5 + 16)  # cnn width 8, 3 channels
HEAD_BYTES = 4 * (16 * 3 + 3)  # 3 classes


@pytest.mark.parametrize(("method", "shared", "personal", "nbytes"), [
    ("fedper", "body", "head", BODY_BYTES),
    ("lgfedavg", "head", "body", HEAD_BYTES),
])
def test_only_the_shared_part_is_sent(tmp_path, method, shared, personal, nbytes):
    m, data = setup(method)
    server = m.init_server()
    assert {k.split(".")[0] for k in server.arrays} == {shared}
    assert m.global_message(server) is None
    down = first_down(m)
    assert down.nbytes == nbytes
    client = data.clients[0]
    up, kept = m.fit(down, Record(), client, 1, seed=1)
    assert {k.split(".")[0] for k in up.arrays} == {shared} and up.nbytes == nbytes
    assert {k.split(".")[0] for k in kept.arrays} == {personal}
    assert all(not np.array_equal(kept.arrays[k], m.initial[k]) for k in kept.arrays)  # trained
    # the client's predictor: the server's shared part with the client's own personal part
    m.personal_predictor(down, kept)
    now = model_arrays(m.model, (shared, personal))
    assert all(np.array_equal(now[k], v) for k, v in {**down.arrays, **kept.arrays}.items())

    res = fedwear.run(tiny_config(method=method), tmp_path)
    cfg = tiny_config(method=method)
    assert res.summary["bytes_up"] == res.summary["bytes_down"] == cfg.rounds * 3 * nbytes
    assert "global" not in res.summary["final"] and "global" not in res.summary["best"]
