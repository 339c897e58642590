"""fedwear export: each client's personalized model as ONNX, checked in onnxruntime against
PyTorch on the client's test windows, with its input and output named and its on-device cost."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import needs_extra

pytestmark = pytest.mark.extra("export")
needs_extra("export")

import fedwear  # noqa: E402
from fedwear.errors import FedwearError  # noqa: E402
from fedwear.export import AsModule, export_run  # noqa: E402
from fedwear.methods import METHODS  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402

MODEL_OF = {"fedali": "hart", "fedmat": "fedmat"}


def finished_run(tmp_path, method: str, **more):
    sets = {"method": method, "checkpoint_every": 1, **more}
    if method in MODEL_OF:
        sets.update({"model.name": MODEL_OF[method], "model.options": "{}"})
    return fedwear.run(tiny_config(**sets), tmp_path / method, quiet=True).out_dir


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_methods_personal_model_exports_and_computes_what_pytorch_computes(tmp_path, method):
    run = finished_run(tmp_path, method, rounds=1)
    done = export_run(run, tmp_path / "out", clients=["s01", "s02"], cost=False)
    assert len(done) == 2
    for e in done:
        assert e.path.is_file() and e.meta["parity"]["max_abs_diff"] <= 1e-5 and e.meta["parity"]["same_predictions"]
        assert e.meta["view"] == "personalized" and e.meta["client"] == e.client


def test_the_json_names_the_input_the_classes_and_the_cost(tmp_path):
    run = finished_run(tmp_path, "metahar", rounds=1)  # a per-client label space: the outputs are the client's classes
    (e,) = export_run(run, tmp_path / "out", clients=["s01"])
    meta = json.loads((tmp_path / "out" / "s01.json").read_text())
    assert meta["input"]["shape"] == ["batch", 32, 3] and meta["input"]["channels"] == ["ch0", "ch1", "ch2"]
    assert meta["input"]["rate_hz"] == 50.0 and meta["input"]["normalization"]["mode"] == "client"
    assert len(meta["input"]["normalization"]["mean"]) == 3
    assert meta["output"]["classes"] == ["class0", "class1", "class2"]
    cost = meta["cost"]
    assert cost["parameters"] > 0 and cost["macs_per_window"] > cost["parameters"] / 2
    assert cost["bytes_fp32"] == e.path.stat().st_size and (tmp_path / "out" / cost["int8_file"]).is_file()
    assert 0 <= cost["int8"] <= 1 and cost["latency_ms_fp32"] > 0


def test_a_model_without_its_head_fails_the_parity_check(tmp_path, monkeypatch):
    run = finished_run(tmp_path, "fedrep", rounds=1)
    monkeypatch.setattr(AsModule, "forward", lambda self, x: self.predictor.body(x))
    with pytest.raises(FedwearError, match="does not compute what the run evaluates"):
        export_run(run, tmp_path / "out", clients=["s01"], cost=False)
    assert not (tmp_path / "out" / "s01.onnx").exists()


def test_the_global_model_and_unknown_clients(tmp_path):
    run = finished_run(tmp_path, "fedavg", rounds=1)
    (e,) = export_run(run, tmp_path / "out", global_model=True, cost=False)
    assert e.client == "global" and e.meta["view"] == "global"
    assert len(export_run(run, tmp_path / "all", cost=False)) == 6  # by default, every training client's
    with pytest.raises(FedwearError, match="not a training client"):
        export_run(run, tmp_path / "out", clients=["nobody"])
    local = finished_run(tmp_path, "local", rounds=1)
    with pytest.raises(FedwearError, match="has no global model"):
        export_run(local, tmp_path / "out2", global_model=True)
    assert np.isfinite(e.meta["parity"]["max_abs_diff"])


def test_compare_ends_with_the_on_device_cost(tmp_path):
    from fedwear.commands import compare

    cfg = tmp_path / "c.yaml"
    cfg.write_text(tiny_config(rounds=1).model_dump_json())
    result = compare(cfg, ["fedavg", "local"], out_dir=tmp_path / "cmp", cost=True)
    section = result.markdown.split("## On-device cost")[1]
    rows = [line for line in section.splitlines() if line.startswith("| fedavg") or line.startswith("| local")]
    assert len(rows) == 2 and "835" in rows[0]  # the tiny cnn's parameters
    assert (tmp_path / "cmp" / "fedavg-s0" / "export" / "s01.json").is_file()
    from fedwear.commands import report

    page = report(tmp_path / "cmp").read_text()
    assert "<h2>On-device cost</h2>" in page and "<td>835</td>" in page
