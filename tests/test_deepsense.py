"""Meta-HAR's embedding network (SPECS 2.2): shapes for UCI HAPT and USC-HAD windows, the size
layer by layer, the layout of the authors' ``norm_sensor_block`` + ``main_model`` forward, the
options, determinism and dropout, and that it learns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedwear.errors import ConfigError
from fedwear.models import MODELS, build_model
from fedwear.models.deepsense import DeepSense

pytestmark = pytest.mark.usefixtures("one_thread")


def model(window=150, channels=6, classes=6, seed=0, **options) -> DeepSense:
    torch.manual_seed(seed)
    return build_model("deepsense", window, channels, classes, **options)


def windows(b=4, t=150, c=6, seed=1) -> torch.Tensor:
    return torch.randn(b, t, c, generator=torch.Generator().manual_seed(seed))


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("window", "intervals"), [(128, 10), (150, 12)])
def test_shapes_for_uci_hapt_and_usc_had_windows(window, intervals):
    """UCI HAPT: 128 samples at 50 Hz (10 intervals of 12); USC-HAD at 50 Hz: 150 (12)."""
    assert MODELS["deepsense"] is DeepSense
    m = model(window).eval()
    x = windows(t=window)
    assert m.body.spectral.out_shape == (intervals, 16, 7)
    seen = {}

    def hook(module, inputs, output) -> None:
        seen["rnn"] = inputs[0].shape

    m.body.rnn.register_forward_hook(hook)
    with torch.no_grad():
        assert m(x).shape == (4, 6)
        assert m.features(x).shape == (4, 100)
    assert seen["rnn"] == (4, intervals, 256)  # batch first, intervals as time, 64 x 4 features


def test_parameter_count_by_layer():
    """Acc + gyro windows, Q = 6 (SPECS 2.2):

    - per sensor: Conv3d(1 -> 64, 1x2x3) 384 + 64 = 448, BN 128; Conv3d(64 -> 64, 1x4x3)
      49,152 + 64 = 49,216, BN 128: 49,920; two sensors 99,840;
    - fusion Conv3d(64 -> 64, 1x2x3) 24,576 + 64 = 24,640, BN 128: 24,768;
    - LSTM(256, 100): 4 x 100 x (256 + 100) + 2 x 400 = 143,200; LSTM(100, 100): 4 x 100 x 200
      + 800 = 80,800: 224,000;
    - head Linear(100, 6): 606.

    Body 348,608, total 349,214. GRU instead: 3 x 100 x 356 + 600 = 107,400 and 3 x 100 x 200
    + 600 = 60,600 (168,000); without magnitudes the axis conv is 1x3x3: 36,864 + 64 per sensor."""
    m = model()
    assert count(m.body.branches) == 2 * (448 + 128 + 49216 + 128) == 99840
    assert count(m.body.fusion) == 24768
    assert count(m.body.rnn) == 143200 + 80800
    assert count(m.body) == 348608 and count(m.head) == 606
    assert count(m) == 349214 == 348608 + 101 * 6
    assert count(model(rnn="gru")) == 349214 - 224000 + 168000
    assert count(model(magnitude=False)) == 349214 - 2 * (49216 - 36928)
    assert count(model(128, classes=12)) == 348608 + 101 * 12  # the window changes only the time axis


def test_layers_as_the_code():
    m = model()
    b = m.body.branches[0]
    pairs, axes, fusion = b.pairs[0], b.axes[0], m.body.fusion[0]
    assert (pairs.kernel_size, pairs.stride, pairs.padding) == ((1, 2, 3), (1, 2, 1), (0, 0, 1))
    assert (axes.kernel_size, axes.stride, axes.padding) == ((1, 4, 3), (1, 4, 1), (0, 0, 1))
    assert (fusion.kernel_size, fusion.stride, fusion.padding) == ((1, 2, 3), (1, 1, 2), (0, 0, 1))
    assert isinstance(m.body.rnn, torch.nn.LSTM) and m.body.rnn.num_layers == 2 and m.body.rnn.batch_first
    assert not any(isinstance(mod, torch.nn.Dropout) for mod in m.modules())  # the code has no dropout


def test_forward_equals_the_codes_time_major_layout():
    """The authors' forward on the same weights: split the 16 rows in 8 + 8, branch convs,
    concatenate on rows, fusion conv, ``permute(2, 0, 1, 3, 4).view(T, B, 256)`` into a
    time-major LSTM, mean over time."""
    m = model().eval()
    x = windows()
    with torch.no_grad():
        feat = m.body.spectral(x).unsqueeze(1)  # [B, 1, 12, 16, 7]
        acc, gyro = torch.split(feat, 8, dim=3)
        out = torch.cat([m.body.branches[0](acc), m.body.branches[1](gyro)], 3)
        out = m.body.fusion(out)  # [B, 64, 12, 1, 4]
        assert out.shape == (4, 64, 12, 1, 4)
        lstm = torch.nn.LSTM(256, 100, 2)  # time-major, as the code
        lstm.load_state_dict(m.body.rnn.state_dict())
        seq, _ = lstm(out.permute(2, 0, 1, 3, 4).contiguous().view(12, -1, 256))
        embedding = torch.mean(seq.permute(1, 0, 2), 1)
        torch.testing.assert_close(m.features(x), embedding)
        torch.testing.assert_close(m(x), m.head(embedding))


ATTENSENSE = {"fusion": "attention", "pooling": "attention", "rnn": "gru"}


def test_attensense_parameter_count_by_layer():
    """The same branches (99,840); sensor attention Linear(64 x 7 = 448, 64) 28,736 + score 64;
    GRU(448, 100) 3 x 100 x 548 + 600 = 165,000, GRU(100, 100) 60,600; interval attention
    Linear(100, 64) 6,464 + 64."""
    m = model(**ATTENSENSE)
    assert count(m.body.branches) == 99840
    assert count(m.body.fusion) == 28736 + 64
    assert count(m.body.rnn) == 165000 + 60600
    assert count(m.body.pool) == 6464 + 64
    assert count(m.body) == 99840 + 28800 + 225600 + 6528 == 360768


def test_attensense_with_flat_scores_averages_sensors_and_intervals():
    """With the score layers at zero every weight is 1/S (sensors) and 1/n (intervals): the
    attention fusion is the mean of the sensor branches' features and the pooling the mean of
    the GRU's outputs, computed here by hand."""
    m = model(**ATTENSENSE).eval()
    x = windows()
    with torch.no_grad():
        m.body.fusion.score.weight.zero_()
        m.body.pool.score.weight.zero_()
        feat = m.body.spectral(x).unsqueeze(1)
        acc, gyro = torch.split(feat, 8, dim=3)
        per_sensor = [b(p).permute(0, 2, 1, 3, 4).flatten(2) for b, p in zip(m.body.branches, (acc, gyro), strict=True)]
        seq, _ = m.body.rnn((per_sensor[0] + per_sensor[1]) / 2)
        torch.testing.assert_close(m.features(x), seq.mean(dim=1))
        m.body.pool.score.weight.normal_()  # scores that differ: not the mean any more
        assert not torch.allclose(m.features(x), seq.mean(dim=1))


def test_frequency_rows_modes_differ_only_in_the_frequency_rows():
    a, b = model(frequency_rows="code").eval(), model(frequency_rows="true").eval()
    assert torch.equal(a.body.spectral(windows())[:, :, 1::2], b.body.spectral(windows())[:, :, 1::2])
    with torch.no_grad():
        assert not torch.allclose(a(windows()), b(windows()))


def test_determinism_from_the_seed_and_no_dropout_in_eval():
    a, b, c = model(seed=3), model(seed=3), model(seed=4)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert not torch.equal(a.head.weight, c.head.weight)
    x = windows()
    with torch.no_grad():
        assert torch.equal(a.eval()(x), b.eval()(x))
    d = model(seed=3, dropout=0.3)
    assert sum(isinstance(mod, torch.nn.Dropout) for mod in d.modules()) == 5 and d.body.rnn.dropout == 0.3
    d.load_state_dict(a.state_dict())  # same parameters: dropout adds none
    with torch.no_grad():
        torch.testing.assert_close(d.eval()(x), a(x))
        assert torch.equal(d(x), d(x))
        d.train()
        torch.manual_seed(0)
        first = d(x)
        assert not torch.equal(first, d(x))  # dropout draws in training
        torch.manual_seed(0)
        assert torch.equal(first, d(x))  # ... from the torch seed


@pytest.mark.parametrize("options", [{}, ATTENSENSE], ids=["deepsense", "attensense"])
def test_learns_a_frequency_task(options):
    """Two classes: 2 Hz vs 6 Hz sinusoids on every axis at 50 Hz, random phase and amplitude."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(32) % 2
    t = torch.arange(48) / 50.0
    freq = torch.where(y == 1, 6.0, 2.0)[:, None, None]
    phase = torch.rand(32, 1, 6, generator=g) * 6.28
    x = (0.5 + torch.rand(32, 1, 1, generator=g)) * torch.sin(2 * torch.pi * freq * t[None, :, None] + phase)
    m = model(48, classes=2, filters=8, embedding=16, **options)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize(("window", "channels", "options", "says"), [
    (150, 4, {}, "3-axis sensors"),
    (10, 6, {}, "fewer than one interval"),
    (150, 6, {"frequency_rows": "none"}, "frequency_rows"),
    (150, 6, {"rnn": "transformer"}, "rnn"),
    (150, 6, {"fusion": "sum"}, "fusion"),
    (150, 6, {"pooling": "max"}, "pooling"),
    (150, 6, {"dropout": 1.0}, "dropout"),
])
def test_bad_shapes_and_options_are_one_line_config_errors(window, channels, options, says):
    with pytest.raises(ConfigError) as err:
        model(window, channels, **options)
    assert says in str(err.value) and "\n" not in str(err.value)
