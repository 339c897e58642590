"""HART (SPECS B1) and FedAli's ALP layer (SPECS B2): shapes, size, Keras initialisation,
DropPath, the three liteFormer modes (the code's cross-sample mixing), determinism; Sinkhorn,
the local prototypes' EMA, inference on local prototypes only, beta, the ablations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedwear.errors import ConfigError
from fedwear.models import MODELS, build_model
from fedwear.models.alp import ALP, ALPOptions, l2_normalize, match_scores, sinkhorn
from fedwear.models.hart import HART, DropPath, LiteFormer, keras_fans

pytestmark = pytest.mark.usefixtures("one_thread")

#: A HART small enough for fast tests: 4 tokens of 32 channels, 2 blocks.
TINY = {"projection_dim": 32, "patch_size": 8, "kernels": [3, 5], "head_units": 16}


def tiny(window=32, channels=3, classes=3, seed=0, **options) -> HART:
    torch.manual_seed(seed)
    return build_model("hart", window, channels, classes, **{**TINY, **options})


def alp_layer(count=6, dim=8, seed=0, **options) -> ALP:
    torch.manual_seed(seed)
    return ALP(dim, count, ALPOptions(prototypes=[count], **options))


def tokens(b=4, z=3, d=8, seed=1) -> torch.Tensor:
    return torch.randn(b, z, d, generator=torch.Generator().manual_seed(seed))


# ---- HART ------------------------------------------------------------------------------------
def test_registered_and_shapes_of_the_default_model():
    assert MODELS["hart"] is HART
    torch.manual_seed(0)
    model = build_model("hart", 128, 6, 6).eval()
    x = torch.randn(5, 128, 6)
    with torch.no_grad():
        assert model(x).shape == (5, 6)
        assert model.features(x).shape == (5, 192)  # the GAP embedding
    assert model.tokens == 8
    # channels 0-95 from the acc patch conv, 96-191 from the gyro one
    assert [tuple(c.weight.shape) for c in model.body.patches] == [(96, 3, 16), (96, 3, 16)]


@pytest.mark.parametrize(("channels", "groups"), [(3, 1), (9, 3), (4, 1)])
def test_other_channel_counts_get_one_patch_conv_per_sensor_triple(channels, groups):
    model = tiny(channels=channels, projection_dim=48)
    assert len(model.body.patches) == groups
    assert sum(c.out_channels for c in model.body.patches) == 48
    assert model.eval()(torch.randn(2, 32, channels)).shape == (2, 3)


@pytest.mark.parametrize(("options", "window", "channels", "says"), [
    ({"patch_size": 64}, 32, 3, "shorter than patch_size"),
    ({"projection_dim": 36}, 32, 3, "multiple of 8"),
    ({"sensors": 4}, 32, 6, "equal groups"),
    ({"projection_dim": 40, "sensors": 3}, 32, 6, "not divisible by sensors=3"),
    ({"alp": {"prototypes": [4, 4, 4]}}, 32, 3, "counts for 2 blocks"),
    ({"alp": {"use_local": False, "use_global": False}}, 32, 3, "both be false"),
    ({"alp": {"matcher": "cosine", "update": "soft_code"}}, 32, 3, "needs matcher=ot"),
    ({"liteformer": "keras"}, 32, 3, "liteformer"),
    ({"depth": 3}, 32, 3, "depth"),
])
def test_shapes_that_cannot_work_are_one_line_config_errors(options, window, channels, says):
    with pytest.raises(ConfigError) as err:
        tiny(window=window, channels=channels, **options)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_parameter_count_matches_specs_by_layer():
    """HART for (128, 6) windows and Q = 6 classes, counted by hand (SPECS B1 "about 1.45 M"):

    - patch convs: 2 x (3*16*96 + 96) = 9,408; position embedding 8 x 192 = 1,536;
    - per block: LayerNorm 2 x 192 = 384 (twice: 768); two MHAs of Q, K, V (48 -> 144, bias:
      7,056 each) and output (144 -> 48, bias: 6,960) = 2 x 28,128 = 56,256; MLP 192 -> 384 ->
      192 with biases 74,112 + 73,920 = 148,032: 205,056 per block, 1,230,336 for six;
    - liteFormer kernels 4 x (3 + 7 + 15 + 31 + 31 + 31) = 472;
    - final LayerNorm 384; head 192 -> 1024 (197,632) and 1024 -> 6 (6,150).

    Total 1,445,918. ALP adds six GLUs of 192 -> 384 (74,112 each: 444,672 parameters) and
    2 x (2048 + 1024 + 512 + 256 + 128 + 64) x 192 = 1,548,288 prototype values (buffers),
    plus a beta per block: 2.38x HART's 1,445,918 values (SPECS B1, Table 3)."""
    model = build_model("hart", 128, 6, 6)
    expected = 9408 + 1536 + 6 * (768 + 56256 + 148032) + 472 + 384 + 197632 + 6150
    assert expected == 1_445_918
    assert sum(p.numel() for p in model.parameters()) == expected
    alp = build_model("hart", 128, 6, 6, alp=True)
    assert sum(p.numel() for p in alp.parameters()) == expected + 6 * 74112
    buffers = dict(alp.named_buffers())
    protos = sum(b.numel() for n, b in buffers.items() if n.endswith("_prototypes"))
    assert protos == 2 * 4032 * 192 == 1_548_288
    assert len(alp.state_dict()) == len(dict(alp.named_parameters())) + len(buffers)
    total = sum(v.numel() for v in alp.state_dict().values())
    assert total / expected == pytest.approx(2.38, abs=0.01)


def test_keras_initialisation():
    torch.manual_seed(3)
    model = build_model("hart", 128, 6, 6, alp=True)
    assert keras_fans((48, 3, 48)) == (144, 2304) and keras_fans((3, 48, 48)) == (144, 144)
    assert keras_fans((16, 3, 96)) == (48, 1536)
    limits = {  # name suffix -> glorot limit of the Keras kernel shape
        "acc_mha.query.weight": math.sqrt(6 / (144 + 2304)),
        "gyro_mha.value.weight": math.sqrt(6 / (144 + 2304)),
        "acc_mha.out.weight": math.sqrt(6 / 288),
        "mlp.0.weight": math.sqrt(6 / (192 + 384)),
        "alp.glu.linear.weight": math.sqrt(6 / (192 + 384)),
        "patches.0.weight": math.sqrt(6 / (48 + 1536)),
        "head.0.weight": math.sqrt(6 / (192 + 1024)),
    }
    named = dict(model.named_parameters())
    for suffix, limit in limits.items():
        ws = [w for n, w in named.items() if n.endswith(suffix)]
        assert ws, suffix
        for w in ws:
            assert w.abs().max() <= limit and w.abs().max() > 0.95 * limit, suffix  # U(-limit, limit)
    for n, w in named.items():
        if n.endswith(".bias") and "norm" not in n:
            assert not w.any(), n
    for block, k in zip(model.body.blocks, [3, 7, 15, 31, 31, 31], strict=True):
        assert block.lite.weight.abs().max() <= math.sqrt(3 / k)
        assert block.norm1.eps == block.norm2.eps == 1e-6
        protos = block.alp.local_prototypes
        assert abs(float(protos.mean())) < 0.05 and abs(float(protos.std()) - 1) < 0.05  # N(0, 1)
        assert not torch.equal(protos, block.alp.global_prototypes)  # independent draws
    assert model.body.position.abs().max() <= 0.05 and model.body.norm.eps == 1e-6


def test_drop_path_is_per_sample_in_training_and_off_in_eval():
    torch.manual_seed(0)
    dp = DropPath(0.5)
    x = torch.ones(400, 3, 2)
    y = dp(x)
    per_sample = y.reshape(400, -1)
    assert ((per_sample == 0).all(1) | (per_sample == 2.0).all(1)).all()  # whole samples, x / keep
    assert 0.35 < float((per_sample[:, 0] == 0).float().mean()) < 0.65
    assert dp.eval()(x) is x
    assert DropPath(0.0)(x) is x
    rates = [b.mlp_drop.rate for b in build_model("hart", 128, 6, 6).body.blocks]
    np.testing.assert_allclose(rates, [0, 0.06, 0.12, 0.18, 0.24, 0.30])


def test_eval_is_deterministic_and_training_is_stochastic():
    model = tiny(seed=1)
    x = torch.randn(6, 32, 3)
    with torch.no_grad():
        torch.manual_seed(5)
        a = model.eval()(x)
        torch.manual_seed(6)
        b = model(x)
        assert torch.equal(a, b)  # no DropPath / dropout at inference
        model.train()
        torch.manual_seed(5)
        c = model(x)
        torch.manual_seed(6)
        d = model(x)
    assert not torch.equal(c, d)


def test_initialisation_and_forward_follow_the_torch_seed():
    x = torch.randn(4, 32, 3)
    a, b, c = tiny(seed=7, alp={"prototypes": [8, 4]}), tiny(seed=7, alp={"prototypes": [8, 4]}), tiny(seed=8)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(a.head[0].weight, c.head[0].weight)
    for m in (a, b):
        m.train()
    torch.manual_seed(1)
    ya = a(x)
    torch.manual_seed(1)
    yb = b(x)
    assert torch.equal(ya, yb)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # also the updated prototypes and kernels


@pytest.mark.parametrize("mode", ["code", "fixed", "time"])
def test_cross_sample_dependence_only_in_code_mode(mode):
    """SPECS F1.3 (b): the code's liteFormer reshape mixes samples of a batch, at evaluation too;
    the fix and the time convolution keep samples apart."""
    model = tiny(liteformer=mode, projection_dim=64).eval()
    x = torch.randn(8, 32, 3)
    x2 = x.clone()
    x2[1] += 1.0
    with torch.no_grad():
        y, y2 = model(x), model(x2)
        alone = model(x[:1])
    same = torch.allclose(y[0], y2[0], atol=1e-6) and torch.allclose(y[0], alone[0], atol=1e-5)
    assert same == (mode != "code")


def reference_lite(u: torch.Tensor, w: torch.Tensor, mode: str) -> torch.Tensor:
    """SPECS F1.3 written out with a conv per head and stack, as the Keras layers (eval mode)."""
    b, t, c = u.shape
    h = w.shape[0]
    if mode == "code":
        r = u.reshape(-1, h, t)
        outs = [F.conv1d(r[:, i : i + 1], w[i : i + 1], padding="same") for i in range(h)]
        return torch.stack(outs, 0).reshape(b, t, c)
    if mode == "fixed":
        r = u.reshape(-1, t, h)
        outs = [F.conv1d(r[:, :, i : i + 1].transpose(1, 2), w[i : i + 1], padding="same").transpose(1, 2)
                for i in range(h)]
        return torch.stack(outs, 2).reshape(b, t, c)
    sm = torch.softmax(w[:, 0], dim=-1).numpy()
    out = np.zeros((b, t, c), np.float32)
    k = w.shape[-1]
    pad = (k - 1) // 2
    for j in range(c):
        kern = sm[j // (c // h)]
        for s in range(b):
            series = np.pad(u[s, :, j].numpy(), (pad, k - 1 - pad))
            out[s, :, j] = [float((series[i : i + k] * kern).sum()) for i in range(t)]
    return torch.from_numpy(out)


@pytest.mark.parametrize("mode", ["code", "fixed", "time"])
def test_liteformer_ops_match_the_written_out_reference(mode):
    torch.manual_seed(2)
    lite = LiteFormer(16, 4, 5, 0.0, mode).eval()
    u = torch.randn(3, 4, 16)
    with torch.no_grad():
        torch.testing.assert_close(lite(u), reference_lite(u, lite.weight.detach(), mode), rtol=1e-5, atol=1e-6)


def test_code_mode_replaces_the_stored_kernel_by_its_softmax_at_every_training_forward():
    torch.manual_seed(0)
    lite = LiteFormer(16, 4, 7, 0.0, "code")
    w0 = lite.weight.detach().clone()
    u = torch.randn(2, 4, 16)
    lite.eval()(u)
    assert torch.equal(lite.weight, w0)  # not at inference
    lite.train()(u)
    torch.testing.assert_close(lite.weight.detach(), torch.softmax(w0, -1))
    lite(u)
    torch.testing.assert_close(lite.weight.detach(), torch.softmax(torch.softmax(w0, -1), -1))  # softmax of softmax
    time_lite = LiteFormer(16, 4, 7, 0.0, "time")
    before = time_lite.weight.detach().clone()
    time_lite.train()(u).sum().backward()
    assert torch.equal(time_lite.weight.detach(), before) and time_lite.weight.grad is not None


def test_code_mode_drop_path_drops_heads_not_samples():
    torch.manual_seed(0)
    lite = LiteFormer(16, 4, 3, 0.5, "code").train()
    u = torch.ones(8, 4, 16)
    with torch.no_grad():
        lite.weight.fill_(0.0)
        lite.weight[:, 0, 1] = 1.0  # identity kernel (after the in-place softmax: not identity, but > 0)
    out = lite(u)
    r = out.reshape(4, -1)  # (heads, rest): the layout before the final reshape
    zero_heads = (r == 0).all(1)
    assert ((r != 0).all(1) | zero_heads).all()  # each head dropped or kept as a whole


# ---- ALP: Sinkhorn -----------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "p"), [(40, 24), (10, 30)])
def test_sinkhorn_plan_is_doubly_stochastic(n, p):
    g = torch.Generator().manual_seed(0)
    scores = l2_normalize(torch.randn(n, 16, generator=g)) @ l2_normalize(torch.randn(p, 16, generator=g)).T
    q = sinkhorn(scores)  # the code's 3 iterations: the last step normalises columns
    assert q.dtype == torch.float32 and (q > 0).all()
    torch.testing.assert_close(q.sum(0), torch.ones(p), rtol=0, atol=1e-5)
    start = torch.exp(scores / 0.05)
    start = start / start.sum() * p
    assert (q.sum(1) - p / n).abs().max() < (start.sum(1) - p / n).abs().max()  # rows move to P/N
    q = sinkhorn(scores, iterations=200)
    torch.testing.assert_close(q.sum(0), torch.ones(p), rtol=0, atol=1e-5)
    torch.testing.assert_close(q.sum(1), torch.full((n,), p / n), rtol=1e-4, atol=0)


def test_sinkhorn_matches_the_code_constants():
    s = torch.tensor([[0.9, 0.1, -0.2], [0.3, 0.8, 0.0]])
    q = torch.exp(s / 0.05)
    q = q / q.sum()
    for _ in range(3):
        q = q / q.sum(1, keepdim=True) / 2
        q = q / q.sum(0, keepdim=True) / 3
    torch.testing.assert_close(sinkhorn(s), q * 3)


# ---- ALP: forward --------------------------------------------------------------------------------
def test_prototypes_are_buffers_in_the_state_dict_under_body():
    model = tiny(alp={"prototypes": [8, 4]})
    state = model.state_dict()
    for i, g in enumerate([8, 4]):
        for name in ("local_prototypes", "global_prototypes"):
            assert state[f"body.blocks.{i}.alp.{name}"].shape == (g, 32)
        assert state[f"body.blocks.{i}.alp.beta"].shape == (1,)
    params = dict(model.named_parameters())
    assert not [n for n in params if "prototypes" in n or n.endswith("beta")]
    assert "body.blocks.0.alp.glu.linear.weight" in params
    assert list(model.alp_layers()) == ["body.blocks.0.alp", "body.blocks.1.alp"]


def test_single_update_moves_only_the_assigned_local_prototypes():
    layer = alp_layer(count=12, dim=8, gamma=0.9).train()
    x = tokens(b=2, z=3)  # 6 tokens, 12 prototypes: some are not picked
    xs = x.reshape(-1, 8)
    before_local = layer.local_prototypes.clone()
    before_global = layer.global_prototypes.clone()
    q = sinkhorn(l2_normalize(xs) @ l2_normalize(torch.cat([before_local, before_global])).T)
    assign = q[:, :12].argmax(1)
    layer(x)
    after = layer.local_prototypes
    assert torch.equal(layer.global_prototypes, before_global)
    for g in range(12):
        picked = (assign == g).nonzero().flatten()
        if len(picked) == 0:
            assert torch.equal(after[g], before_local[g])  # bitwise unchanged
        else:
            last = int(picked.max())  # duplicates: the last token in (sample, token) order wins
            torch.testing.assert_close(after[g], 0.9 * before_local[g] + 0.1 * xs[last])
    assert len(assign.unique()) < 12


def test_duplicate_assignments_take_the_last_token():
    from fedwear.models.alp import single_update

    protos = torch.zeros(3, 2)
    x = torch.tensor([[1.0, 0], [2.0, 0], [3.0, 0], [4.0, 0]])
    single_update(protos, torch.tensor([2, 0, 2, 0]), x, 0.5)
    torch.testing.assert_close(protos, torch.tensor([[2.0, 0], [0, 0], [1.5, 0]]))


def test_training_aligns_to_global_prototypes_and_inference_to_local_ones():
    layer = alp_layer(count=5, dim=8, beta=1.0, glu=False)
    x = tokens()
    xs = x.reshape(-1, 8)
    local, glob = layer.local_prototypes.clone(), layer.global_prototypes.clone()
    q = sinkhorn(l2_normalize(xs) @ l2_normalize(torch.cat([local, glob])).T)
    out = layer.train()(x)  # beta 1, no GLU: the matched prototype itself
    torch.testing.assert_close(out.reshape(-1, 8), l2_normalize(glob[q[:, 5:].argmax(1)]))
    local = layer.local_prototypes.clone()
    out = layer.eval()(x)
    a = sinkhorn(l2_normalize(xs) @ l2_normalize(local).T).argmax(1)
    torch.testing.assert_close(out.reshape(-1, 8), l2_normalize(local[a]))


def test_inference_uses_only_the_local_prototypes():
    model = tiny(alp={"prototypes": [8, 4]}).eval()
    x = torch.randn(5, 32, 3)
    with torch.no_grad():
        y = model(x)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        for layer in model.alp_layers().values():
            layer.global_prototypes.normal_()
        assert torch.equal(model(x), y)
        for layer in model.alp_layers().values():
            layer.local_prototypes.normal_()
        assert not torch.equal(model(x), y)
    for k, v in model.state_dict().items():  # nothing else moved, and evaluation updates nothing
        if "prototypes" not in k:
            assert torch.equal(v, state[k]), k


@pytest.mark.parametrize("training", [True, False])
def test_beta_zero_gives_the_normalised_tokens(training):
    layer = alp_layer(beta=0.2).train(training)
    layer.beta.fill_(0.0)  # as the method's beta array sets it
    x = tokens()
    torch.testing.assert_close(layer(x), l2_normalize(x), rtol=0, atol=0)
    layer.beta.fill_(0.2)
    assert not torch.allclose(layer(x), l2_normalize(x))


def test_output_mixes_glu_of_the_match_and_gets_no_gradient_into_prototypes():
    layer = alp_layer(beta=0.3).eval()
    x = tokens().requires_grad_(True)
    out = layer(x)
    xs = x.detach().reshape(-1, 8)
    m = layer.local_prototypes[sinkhorn(l2_normalize(xs) @ l2_normalize(layer.local_prototypes).T).argmax(1)]
    expected = l2_normalize((0.3 * layer.glu(m) + 0.7 * xs).reshape(x.shape))
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert x.grad is not None and layer.glu.linear.weight.grad is not None
    assert not any(b.requires_grad for b in layer.buffers())


def test_without_global_prototypes_training_matches_and_updates_the_local_set():
    layer = alp_layer(count=5, beta=1.0, glu=False, use_global=False, gamma=0.5).train()
    assert not hasattr(layer, "global_prototypes") or "global_prototypes" not in dict(layer.named_buffers())
    x = tokens()
    xs = x.reshape(-1, 8)
    local = layer.local_prototypes.clone()
    a = sinkhorn(l2_normalize(xs) @ l2_normalize(local).T).argmax(1)
    out = layer(x)
    torch.testing.assert_close(out.reshape(-1, 8), l2_normalize(local[a]))  # matched before the update
    assert not torch.equal(layer.local_prototypes, local)


def test_without_local_prototypes_nothing_updates_and_inference_uses_the_global_set():
    layer = alp_layer(count=5, beta=1.0, glu=False, use_local=False)
    assert "local_prototypes" not in dict(layer.named_buffers())
    x = tokens()
    xs = x.reshape(-1, 8)
    glob = layer.global_prototypes.clone()
    for training in (True, False):
        out = layer.train(training)(x)
        a = sinkhorn(l2_normalize(xs) @ l2_normalize(glob).T).argmax(1)
        torch.testing.assert_close(out.reshape(-1, 8), l2_normalize(glob[a]))
    assert torch.equal(layer.global_prototypes, glob)


@pytest.mark.parametrize(("update", "batch", "count"), [("soft_code", 8, 2), ("soft_code", 4, 6), ("soft_paper", 4, 5)])
def test_soft_updates_move_every_local_prototype_to_its_top_k_tokens(update, batch, count):
    layer = alp_layer(count=count, update=update, gamma=0.8).train()
    x = tokens(b=batch, z=3)
    xs = x.reshape(-1, 8)
    local, glob = layer.local_prototypes.clone(), layer.global_prototypes.clone()
    q = sinkhorn(l2_normalize(xs) @ l2_normalize(torch.cat([local, glob])).T)[:, :count]
    k = max(batch // count, 1) if update == "soft_code" else math.ceil(len(xs) / count)
    src = xs if update == "soft_code" else l2_normalize(xs)
    expected = torch.empty_like(local)
    for g in range(count):
        w, idx = torch.topk(q[:, g], k)
        expected[g] = 0.8 * local[g] + 0.2 * (w[:, None] * src[idx]).sum(0) / w.sum()
    layer(x)
    torch.testing.assert_close(layer.local_prototypes, expected)


@pytest.mark.parametrize("matcher", ["cosine", "euclidean"])
def test_alternative_matchers_pick_nearest_prototypes(matcher):
    layer = alp_layer(count=7, beta=1.0, glu=False, matcher=matcher).eval()
    x = tokens()
    xs = x.reshape(-1, 8)
    protos = layer.local_prototypes
    cos = l2_normalize(xs) @ l2_normalize(protos).T
    dist = torch.cdist(l2_normalize(xs), l2_normalize(protos))
    a = cos.argmax(1) if matcher == "cosine" else dist.argmin(1)
    assert torch.equal(match_scores(xs, protos, matcher).argmax(1), a)
    torch.testing.assert_close(layer(x).reshape(-1, 8), l2_normalize(protos[a]))


def test_hart_alp_trains_with_backward_and_updates_local_prototypes_only():
    model = tiny(alp={"prototypes": [8, 4]}).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    loss = F.cross_entropy(model(torch.randn(6, 32, 3)), torch.tensor([0, 1, 2, 0, 1, 2]))
    loss.backward()
    after = model.state_dict()
    for k in before:
        moved = not torch.equal(before[k], after[k])
        assert moved == (k.endswith("local_prototypes") or k.endswith("lite.weight")), k
