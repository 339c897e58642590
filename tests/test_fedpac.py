"""FedPAC (Xu et al., ICLR 2023; SPECS B6): the feature statistics h and v, the head-combination
QP (eigenvalue clipping, floor), the round's two steps, the alignment target, each client's
own combined head, and whole runs (deterministic, the same under sim and flower-sim)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fedwear
from fedwear.data import load_federated
from fedwear.errors import ConfigError
from fedwear.methods import Record, Task, build_method
from fedwear.methods.fedavg import tensors
from fedwear.methods.fedpac import (
    COMBINED,
    STAT_H,
    STAT_V,
    clip_eigenvalues,
    combination_weights,
    feature_statistics,
    simplex_qp,
)
from fedwear.methods.fit import Fit
from fedwear.methods.prototypes import COUNT, MASK, PROTO
from fedwear.methods.training import load_arrays
from tests.helpers import tiny_config, tiny_regression_config

pytestmark = pytest.mark.usefixtures("one_thread")

HEAD = {"head.weight", "head.bias"}


def opt(name: str) -> str:
    return f"method_options.fedpac.{name}"


def setup(**overrides):
    cfg = tiny_config(method="fedpac", **overrides)
    data = load_federated(cfg.dataset, cfg.seed)
    return build_method(Task.of(cfg, data)), data


def first_down(m, client="s01"):
    """The first round's message with the initial body (``init_server`` reads the method's one
    model object, which a previous ``fit`` trained)."""
    down = m.configure(m.init_server(), client, 1)
    down.arrays.update({k: v.copy() for k, v in m.initial.items() if k in down.arrays})
    return down


def features_under(m, arrays, client):
    """The train split's features under ``arrays`` in a fresh model, eval mode."""
    model = m.new_model()
    load_arrays(model, arrays)
    x, _ = tensors(client)
    with torch.no_grad():
        return model.eval().features(x)


def numpy_statistics(z, y, q):
    """h and v straight from the definition (SPECS B6), one class at a time."""
    n = len(y)
    h = np.zeros((q, z.shape[1]))
    v = 0.0
    for j in range(q):
        zj = z[y == j]
        if not len(zj):
            continue
        p = len(zj) / n
        mu = zj.mean(0)
        h[j] = p * mu
        v += p * np.trace(zj.T @ zj / len(zj)) - p**2 * mu @ mu
    return h, v / n


# ---- 1. statistics ----------------------------------------------------------------------------
def test_statistics_match_a_direct_numpy_computation():
    rng = np.random.default_rng(0)
    q, n = 4, 30
    z = rng.normal(1.0, 2.0, size=(n, 5))
    y = rng.choice([0, 1, 3], size=n, p=[0.5, 0.3, 0.2])  # class 2 absent
    means, counts, h, v = feature_statistics(torch.from_numpy(z).float(), torch.from_numpy(y), q)
    zf = z.astype(np.float32).astype(np.float64)  # what the method sees
    h_ref, v_ref = numpy_statistics(zf, y, q)
    np.testing.assert_allclose(h, h_ref, rtol=1e-5, atol=1e-6)
    assert v.shape == (1,) and v.dtype == np.float64
    np.testing.assert_allclose(v[0], v_ref, rtol=1e-6)
    np.testing.assert_array_equal(counts, np.bincount(y, minlength=q))
    for j in range(q):
        expected = zf[y == j].mean(0) if (y == j).any() else np.zeros(5)
        np.testing.assert_allclose(means[j], expected, rtol=1e-5, atol=1e-6)
    assert not h[2].any() and not means[2].any()
    # v is the variance of the sample mean of z e_y^T: E||z e_y^T - h||_F^2 / n
    onehot = np.eye(q)[y]
    outer = zf[:, None, :] * onehot[:, :, None]  # [n, Q, k]
    np.testing.assert_allclose(v[0], ((outer - h_ref) ** 2).sum((1, 2)).mean() / n, rtol=1e-6)


# ---- 2. the QP --------------------------------------------------------------------------------
def test_qp_favours_the_identical_client_over_a_far_one():
    a, far = np.ones((3, 4)), np.full((3, 4), 20.0)
    h = np.stack([a, a, far]).reshape(3, -1)
    alpha = combination_weights(h, np.full(3, 0.5))
    assert (alpha >= 0).all()
    np.testing.assert_allclose(alpha.sum(1), 1.0, atol=1e-12)
    # client 0: its twin shares the variance, the far one only adds bias
    np.testing.assert_allclose(alpha[0], [0.5, 0.5, 0.0], atol=1e-4)
    np.testing.assert_allclose(alpha[1], [0.5, 0.5, 0.0], atol=1e-4)
    np.testing.assert_allclose(alpha[2], [0.0, 0.0, 1.0], atol=1e-4)  # nobody is like it


def test_qp_with_equal_statistics_weights_by_inverse_variance():
    h = np.zeros((2, 6))
    np.testing.assert_allclose(combination_weights(h, np.array([1.0, 3.0])), [[0.75, 0.25]] * 2, atol=1e-5)


def test_simplex_qp_meets_the_kkt_conditions():
    rng = np.random.default_rng(1)
    for _ in range(5):
        a = rng.normal(size=(6, 6))
        p = a @ a.T + np.diag(rng.random(6))
        alpha = simplex_qp(p)
        assert alpha is not None and (alpha >= 0).all() and abs(alpha.sum() - 1) < 1e-12
        grad = p @ alpha
        lam = grad[alpha > 1e-6].mean()
        np.testing.assert_allclose(grad[alpha > 1e-6], lam, rtol=1e-4)  # equal on the support
        assert (grad[alpha <= 1e-6] >= lam * (1 - 1e-4)).all()  # no better direction off it
        # and nothing on the simplex does better
        trials = rng.dirichlet(np.ones(6), size=2000)
        assert (np.einsum("ti,ij,tj->t", trials, p, trials) >= alpha @ p @ alpha - 1e-9).all()


def test_combination_weights_equal_the_qp_on_the_pairwise_matrix():
    # D_i[j1, j2] = <h_i - h_j1, h_i - h_j2> over the flattened statistics, built pair by pair
    rng = np.random.default_rng(4)
    m = 5
    h = rng.normal(0.3, 0.2, size=(m, 3, 4))  # [m, Q, k], as the replies carry them
    v = rng.uniform(0.05, 0.2, m)
    alpha = combination_weights(h.reshape(m, -1), v, floor=0.0)
    for i in range(m):
        d = np.array([[np.sum((h[i] - h[j1]) * (h[i] - h[j2])) for j2 in range(m)] for j1 in range(m)])
        expected = simplex_qp(clip_eigenvalues(np.diag(v) + d, 0.01))
        np.testing.assert_allclose(alpha[i], expected, atol=1e-6)
    assert len({tuple(np.round(a, 3)) for a in alpha}) == m  # one combination per client


def test_eigenvalue_clipping_makes_the_matrix_psd():
    rng = np.random.default_rng(2)
    vecs, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    vals = np.array([-0.5, 0.005, 0.2, 3.0])
    p = (vecs * vals) @ vecs.T
    clipped = clip_eigenvalues(p, 0.01)
    np.testing.assert_allclose(clipped, clipped.T)
    got = np.linalg.eigvalsh(clipped)
    assert got.min() > -1e-12  # positive semi-definite
    np.testing.assert_allclose(np.sort(got), [0, 0, 0.2, 3.0], atol=1e-12)
    # the kept eigenpairs are untouched
    np.testing.assert_allclose(clipped @ vecs[:, 3], 3.0 * vecs[:, 3], atol=1e-12)


def test_combination_weights_use_the_clipped_matrix():
    h = np.zeros((2, 3))
    # diag(0.001, 0.004): both eigenvalues below 0.01 are dropped, the matrix is 0, the
    # uniform start is optimal; unclipped, the weights go by inverse variance (0.8, 0.2)
    np.testing.assert_allclose(combination_weights(h, np.array([0.001, 0.004])), [[0.5, 0.5]] * 2, atol=1e-9)
    np.testing.assert_allclose(combination_weights(h, np.array([0.001, 0.004]), eig_clip=0.0),
                               [[0.8, 0.2]] * 2, atol=1e-4)


def test_small_weights_are_zeroed_and_the_rest_renormalised():
    h = np.zeros((3, 2))
    v = np.array([1.0, 1.0, 2000.0])  # inverse variance: 0.49988, 0.49988, 0.00025
    np.testing.assert_allclose(combination_weights(h, v, floor=0.0)[0, 2], 1 / 2000 / (2 + 1 / 2000), rtol=1e-3)
    alpha = combination_weights(h, v)
    np.testing.assert_array_equal(alpha[:, 2], 0.0)
    np.testing.assert_allclose(alpha, [[0.5, 0.5, 0.0]] * 3, atol=1e-6)


# ---- 3. the round: head step on a frozen body, then the body on a frozen head ----------------------
def weights(model, part):
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith(part + ".")}


def changed(before, after):
    return {k for k in before if not torch.equal(before[k], after[k])}


def test_head_step_then_body_step(monkeypatch):
    m, data = setup(**{opt("head_epochs"): 2})
    calls = []
    original = m.train

    def spy(model, o, *args, **kwargs):
        trainable = {n.split(".")[0] for n, p in model.named_parameters() if p.requires_grad}
        in_opt = {id(p) for g in o.optimizer.param_groups for p in g["params"]}
        parts = {n.split(".")[0] for n, p in model.named_parameters() if id(p) in in_opt}
        lr = o.optimizer.param_groups[0]["lr"]
        before = {part: weights(model, part) for part in ("body", "head")}
        loss = original(model, o, *args, **kwargs)
        moved = {part: changed(before[part], weights(model, part)) for part in ("body", "head")}
        calls.append((o.name, trainable, parts, kwargs.get("epochs"), lr, moved))
        return loss

    monkeypatch.setattr(m, "train", spy)
    up, kept = m.fit(first_down(m), Record(), data.clients[0], 1, seed=2)
    assert [c[0] for c in calls] == ["head", "body"]
    (_, h_grad, h_opt, h_epochs, h_lr, h_moved), (_, b_grad, b_opt, b_epochs, b_lr, b_moved) = calls
    assert h_grad == h_opt == {"head"} and h_epochs == 2
    assert h_lr == pytest.approx(10 * m.task.training.optimizer.lr) and b_lr == pytest.approx(m.task.training.optimizer.lr)
    assert not h_moved["body"] and h_moved["head"] == HEAD  # the body unchanged by step 1
    assert b_grad == b_opt == {"body"} and b_epochs == m.local_epochs
    assert not b_moved["head"] and b_moved["body"] == {k for k in m.initial if k.startswith("body.")}
    assert all(p.requires_grad for p in m.model.parameters())  # unfrozen afterwards
    assert set(kept.arrays) == HEAD
    for k in HEAD:  # the reply's head is the trained one, kept by the client too
        np.testing.assert_array_equal(up.arrays[k], kept.arrays[k])


def test_the_round_starts_from_the_combined_head_not_the_kept_one():
    # head_epochs 0: the head is never trained, so the kept head is the one the round started from
    m, data = setup(**{opt("head_epochs"): 0})
    client = data.clients[0]
    rng = np.random.default_rng(3)
    mine = Record({k: rng.normal(size=m.initial[k].shape).astype(np.float32) for k in HEAD})
    combined = {k: rng.normal(size=m.initial[k].shape).astype(np.float32) for k in HEAD}
    down = first_down(m)
    _, kept = m.fit(down, mine, client, 2, seed=1)
    for k in HEAD:
        np.testing.assert_array_equal(kept.arrays[k], mine.arrays[k])  # no combined head yet: its own
    down.arrays.update(combined)
    _, kept = m.fit(down, mine, client, 2, seed=1)
    for k in HEAD:
        np.testing.assert_array_equal(kept.arrays[k], combined[k])


# ---- 4. the body step's objective and the reply ---------------------------------------------------
def test_body_loss_is_ce_plus_lambda_mse_to_the_targets():
    m, data = setup(**{opt("lamda"): 2.5})
    x, y = tensors(data.clients[0])
    x, y = x[:10], y[:10]
    model = m.model
    k = m.dim
    targets = torch.randn(3, k, generator=torch.Generator().manual_seed(0))
    fit = Fit(Record(), Record(), None, 0, inputs={"targets": targets, "target_mask": torch.ones(3)})
    z = model.features(x)
    expected = F.cross_entropy(model.head(z), y) + 2.5 * ((z - targets[y]) ** 2).mean()
    torch.testing.assert_close(m.loss(model, x, y, fit), expected)


def test_first_round_targets_are_the_clients_own_class_means(monkeypatch):
    m, data = setup(**{"dataset.drop_classes": 1})
    client = data.clients[0]
    seen = []
    original = m.loss

    def spy(model, x, y, fit):
        seen.append((fit.inputs["targets"].clone(), fit.inputs["target_mask"].clone()))
        return original(model, x, y, fit)

    monkeypatch.setattr(m, "loss", spy)
    down = first_down(m)
    m.fit(down, Record(), client, 1, seed=4)
    targets, mask = seen[0]
    y = client.train.y
    z = features_under(m, down.arrays, client).double().numpy()
    absent = sorted(set(range(3)) - set(y.tolist()))
    assert len(absent) == 1
    for j in range(3):
        if j in absent:
            assert mask[j] == 0
        else:
            assert mask[j] == 1
            np.testing.assert_allclose(targets[j].numpy(), z[y == j].mean(0), rtol=1e-5, atol=1e-6)
    # with global prototypes for every class, those are the targets (no own means)
    down.arrays[PROTO] = np.random.default_rng(5).random(down.arrays[PROTO].shape).astype(np.float32)
    down.arrays[MASK] = np.ones(3, np.float32)
    seen.clear()
    m.fit(down, Record(), client, 2, seed=4)
    np.testing.assert_array_equal(seen[0][0].numpy(), down.arrays[PROTO])
    # a class missing from the global prototypes falls back to the client's own mean
    down.arrays[MASK] = np.array([1, 0, 1], np.float32)
    seen.clear()
    m.fit(down, Record(), client, 2, seed=4)
    if 1 not in absent:
        np.testing.assert_allclose(seen[0][0][1].numpy(), z[y == 1].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(seen[0][0][0].numpy(), down.arrays[PROTO][0])


def test_the_alignment_term_moves_the_body():
    one, data = setup()
    zero, _ = setup(**{opt("lamda"): 0.0})
    client = data.clients[0]
    down = first_down(one)
    down.arrays[PROTO] = np.random.default_rng(6).random(down.arrays[PROTO].shape).astype(np.float32)
    down.arrays[MASK] = np.ones(3, np.float32)
    a, _ = one.fit(down, Record(), client, 2, seed=3)
    b, _ = zero.fit(down, Record(), client, 2, seed=3)
    assert max(np.abs(a.arrays[k] - b.arrays[k]).max() for k in a.arrays if k.startswith("body.")) > 1e-4
    for k in HEAD:  # the head step comes first and does not see the prototypes
        np.testing.assert_array_equal(a.arrays[k], b.arrays[k])


@pytest.mark.parametrize("statistics", ["trained", "received"])
def test_reply_carries_prototypes_and_statistics(statistics):
    m, data = setup(**{opt("statistics"): statistics})
    client = data.clients[1]
    down = first_down(m)
    up, kept = m.fit(down, Record(), client, 1, seed=8)
    assert m.validate_reply(down, up) is None
    assert up.scalars["num_examples"] == len(client.train)
    y = client.train.y
    trained = features_under(m, {**up.arrays, **kept.arrays}, client)
    means, counts, h, v = feature_statistics(trained, torch.from_numpy(y), 3)
    np.testing.assert_allclose(up.arrays[PROTO], means, rtol=1e-5, atol=1e-6)  # always after training
    np.testing.assert_array_equal(up.arrays[COUNT], counts)
    if statistics == "received":
        _, _, h, v = feature_statistics(features_under(m, down.arrays, client), torch.from_numpy(y), 3)
    np.testing.assert_allclose(up.arrays[STAT_H], h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(up.arrays[STAT_V], v, rtol=1e-5)
    h_ref, v_ref = numpy_statistics(trained.double().numpy(), y, 3)
    if statistics == "trained":
        np.testing.assert_allclose(up.arrays[STAT_H], h_ref, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(up.arrays[STAT_V][0], v_ref, rtol=1e-4)


# ---- 5. the server: FedAvg body, count-weighted prototypes, one combined head per client ----------
def fake_replies(m, seed=0):
    """Three replies: a and b with the same statistics, c far from both."""
    rng = np.random.default_rng(seed)
    k = m.dim

    def reply(n, h_scale, counts, proto):
        arrays = {name: rng.normal(size=a.shape).astype(np.float32) for name, a in m.initial.items()}
        return Record({**arrays, PROTO: np.full((3, k), proto, np.float32), COUNT: np.array(counts, np.float32),
                       STAT_H: np.full((3, k), h_scale, np.float32), STAT_V: np.array([0.5])},
                      {"num_examples": n, "loss": 0.0})

    return {"c": reply(30, 5.0, [10, 0, 20], 3.0), "a": reply(10, 1.0, [5, 5, 0], 1.0),
            "b": reply(20, 1.0, [5, 15, 0], 2.0)}


def test_each_client_gets_its_own_combined_head():
    m, _ = setup()
    replies = fake_replies(m)
    server = m.aggregate(m.init_server(), replies, 1)
    for name in m.body_keys:  # FedAvg: 10, 20, 30 windows
        expected = (10 * replies["a"].arrays[name] + 20 * replies["b"].arrays[name]
                    + 30 * replies["c"].arrays[name]) / 60
        np.testing.assert_allclose(server.arrays[name], expected, rtol=1e-5, atol=1e-6)
    # prototypes: count-weighted per class; class 1 only a and b, class 2 only c
    np.testing.assert_allclose(server.arrays[PROTO][:, 0], [(5 * 1 + 5 * 2 + 10 * 3) / 20, (5 * 1 + 15 * 2) / 20, 3.0],
                               rtol=1e-6)
    np.testing.assert_array_equal(server.arrays[MASK], [1, 1, 1])
    heads = {c: m.configure(server, c, 2) for c in "abc"}
    for name in HEAD:
        mean_ab = (replies["a"].arrays[name].astype(np.float64) + replies["b"].arrays[name]) / 2
        np.testing.assert_allclose(heads["a"].arrays[name], mean_ab, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(heads["b"].arrays[name], mean_ab, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(heads["c"].arrays[name], replies["c"].arrays[name], rtol=1e-3, atol=1e-4)
        assert not np.allclose(heads["a"].arrays[name], heads["c"].arrays[name])
    for c, down in heads.items():
        assert set(down.arrays) == set(m.body_keys) | HEAD | {PROTO, MASK}, c
        assert m.reply_spec(down)[STAT_V] == (1,)
    # a client absent from the next round keeps its combined head on the server
    later = m.aggregate(server, {"a": replies["a"], "b": replies["b"]}, 2)
    for name in HEAD:
        np.testing.assert_array_equal(m.configure(later, "c", 3).arrays[name], heads["c"].arrays[name])
    assert m.aggregate(later, {}, 3) is later
    assert not set(m.configure(later, "zz", 3).arrays) & HEAD  # never trained: no head sent
    assert m.global_message(later) is None
    assert all(k.startswith(COMBINED) or not k.startswith("head.") for k in later.arrays)


def test_evaluation_uses_the_trained_head_by_default():
    m, data = setup()
    comb, _ = setup(**{opt("evaluate_head"): "combined"})
    server = m.aggregate(m.init_server(), fake_replies(m), 1)
    msg = m.evaluation_message(server, "a", 1)
    assert set(msg.arrays) == set(m.body_keys)  # no prototypes, no head
    assert set(comb.evaluation_message(server, "a", 1).arrays) == set(m.body_keys) | HEAD
    state = Record({k: np.random.default_rng(9).normal(size=m.initial[k].shape).astype(np.float32) for k in HEAD})
    combined = m.configure(server, "a", 1).arrays
    x, _ = tensors(data.clients[0])

    def check(pred, head):
        with torch.no_grad():
            z = pred.body(x[:4]).numpy()
            out = pred.head(torch.from_numpy(z)).numpy()
        np.testing.assert_allclose(out, z @ head["head.weight"].T + head["head.bias"], rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(z, features_under(m, server.arrays, data.clients[0])[:4].numpy())

    check(m.personal_predictor(msg, state), state.arrays)  # the server's body, its own head
    check(comb.personal_predictor(comb.evaluation_message(server, "a", 1), state), combined)


def test_a_new_client_trains_a_head_on_the_global_body():
    m, data = setup()
    server = m.aggregate(m.init_server(), fake_replies(m), 1)
    new = data.new_clients[0]
    down = m.evaluation_message(server, new.client_id, 1)
    adapted = m.adapt(down, new, seed=1)
    assert set(adapted.arrays) == HEAD
    assert all(not np.array_equal(adapted.arrays[k], m.initial[k]) for k in HEAD)
    pred = m.personal_predictor(down, adapted)
    assert pred is not None


# ---- 6. whole runs ----------------------------------------------------------------------------
def test_runs_are_deterministic_and_count_their_bytes(tmp_path):
    cfg = tiny_config(method="fedpac")
    a = fedwear.run(cfg, tmp_path / "a")
    b = fedwear.run(cfg, tmp_path / "b")
    assert (a.out_dir / "metrics.csv").read_bytes() == (b.out_dir / "metrics.csv").read_bytes()
    assert "global" not in a.summary["final"]
    body = 4 * (8 * 3 * 5 + 8 + 16 * 8 * 5 + 16)  # cnn width 8, 3 channels: k = 16
    head = 4 * (16 * 3 + 3)
    up = body + head + 4 * (3 * 16 + 3 + 3 * 16) + 8  # + prototypes, counts, h, v
    assert a.summary["bytes_up"] == cfg.rounds * 3 * up
    protos = 4 * (3 * 16 + 3)
    # round 1: body + prototypes; later rounds also the combined head of clients seen before
    assert a.summary["bytes_down"] >= cfg.rounds * 3 * (body + protos)
    assert a.summary["bytes_down"] <= cfg.rounds * 3 * (body + protos + head)


def test_regression_and_central_dp_are_refused():
    with pytest.raises(ConfigError, match="does not handle regression"):
        tiny_regression_config(method="fedpac")
    with pytest.raises(ConfigError, match="privacy.dp"):
        tiny_config(method="fedpac", **{"privacy.dp": "central"})
