"""fedwear export --format pte: each client's personalized model as an ExecuTorch program (XNNPACK),
checked in ExecuTorch's runtime against PyTorch on the client's test windows."""

from __future__ import annotations

import json

import pytest

from tests.conftest import needs_extra

pytestmark = pytest.mark.extra("executorch")
needs_extra("executorch")

from fedwear.errors import FedwearError  # noqa: E402
from fedwear.export import AsModule, export_run  # noqa: E402
from fedwear.methods import METHODS  # noqa: E402
from tests.test_export import finished_run  # noqa: E402


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_methods_personal_model_runs_in_executorch_as_in_pytorch(tmp_path, method):
    run = finished_run(tmp_path, method, rounds=1)
    (e,) = export_run(run, tmp_path / "out", clients=["s02"], cost=False, fmt="pte")
    assert e.path.name == "s02.pte" and e.path.is_file()
    assert e.meta["parity"]["windows"] > 0 and e.meta["parity"]["max_scaled_diff"] <= 1e-5
    assert e.meta["parity"]["same_predictions"] and e.meta["format"] == "pte"


def test_the_pte_json_sits_beside_the_onnx_one_and_gives_one_window_a_call(tmp_path):
    run = finished_run(tmp_path, "fedrep", rounds=1)
    export_run(run, tmp_path / "out", clients=["s01"], cost=False)
    (e,) = export_run(run, tmp_path / "out", clients=["s01"], fmt="pte")
    onnx, pte = (json.loads((tmp_path / "out" / n).read_text()) for n in ("s01.json", "s01.pte.json"))
    assert onnx["format"] == "onnx" and pte["format"] == "pte" and pte["file"] == "s01.pte"
    assert pte["input"]["shape"] == [1, 32, 3] and pte["output"] == onnx["output"]
    cost = pte["cost"]
    assert cost["bytes_fp32"] == e.path.stat().st_size and cost["latency_ms_fp32"] > 0
    assert cost["parameters"] == onnx["cost"]["parameters"] if "cost" in onnx else cost["parameters"] > 0


def test_a_program_without_its_head_fails_the_parity_check(tmp_path, monkeypatch):
    run = finished_run(tmp_path, "fedrep", rounds=1)
    monkeypatch.setattr(AsModule, "forward", lambda self, x: self.predictor.body(x))
    with pytest.raises(FedwearError, match="the pte model does not compute what the run evaluates"):
        export_run(run, tmp_path / "out", clients=["s01"], cost=False, fmt="pte")
    assert not (tmp_path / "out" / "s01.pte").exists()


def test_a_depth_one_conv3d_is_the_same_conv2d_over_each_slice_and_one_spanning_depth_is_refused(tmp_path):
    import torch

    from fedwear.export import Conv3dAsConv2d, export_pte

    torch.manual_seed(0)
    conv = torch.nn.Conv3d(4, 6, (1, 2, 3), stride=(1, 2, 1), padding=(0, 0, 2)).eval()
    x = torch.randn(2, 4, 5, 8, 9)
    with torch.no_grad():
        torch.testing.assert_close(Conv3dAsConv2d(conv)(x), conv(x), rtol=0, atol=1e-5)
    deep = torch.nn.Sequential(torch.nn.Conv3d(1, 2, (3, 1, 1)), torch.nn.Flatten())
    with pytest.raises(FedwearError, match="spans depth, and ExecuTorch has no 3-D convolution"):
        export_pte(deep, torch.randn(2, 1, 4, 3, 3), tmp_path / "m.pte")
    assert isinstance(deep[0], torch.nn.Conv3d)  # the module is left as it was
