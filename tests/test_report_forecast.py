"""``fedwear report`` on regression runs: PCFedH's Fig. 4 (heart rate over time of one client)
and Fig. 3 (t-SNE of the encoder features by nearest prototype), units in the tables and plots,
and classification reports left as they were."""

from __future__ import annotations

import importlib
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from matplotlib.image import imread
from typer.testing import CliRunner

import fedwear
from fedwear.callbacks import load_checkpoint
from fedwear.cli import app
from fedwear.config import load_config
from fedwear.data import load_federated
from fedwear.methods import Record, Task, build_method
from fedwear.models.ts2vec import TSEncoder, instance_representation
from fedwear.report import forecast as forecast_mod
from fedwear.report.embeddings import Restored, Skipped, restore
from fedwear.report.forecast import client_forecast, forecast_figure
from fedwear.report.prototypes import encoder_features, sample
from fedwear.report.rundir import load
from fedwear.report.units import axis_label, units_note
from tests.helpers import figure_texts, tiny_config, tiny_regression_config

PCFEDH = {"pcl_rounds": 1, "clusters": 2, "per_cluster": 2, "encoder_epochs": 1, "crop_margin": 4}
WINDOWS = 60  # --tsne-windows in these tests (the default, 500, takes longer)


def report(path: Path, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, ["report", str(path), *args])
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture(scope="module")
def cmp(tmp_path_factory) -> Path:
    """PCFedH and FedProx (the methods of the paper's Fig. 4) on synthetic heart rate."""
    root = tmp_path_factory.mktemp("forecast") / "cmp"
    fedwear.run(tiny_regression_config(method="pcfedh", **{"method_options.pcfedh": PCFEDH}),
                root / "pcfedh-s0")
    fedwear.run(tiny_regression_config(method="fedprox"), root / "fedprox-s0")
    return root


@pytest.fixture(scope="module")
def page(cmp) -> Path:
    code, out, err = report(cmp, "--tsne-windows", str(WINDOWS))
    assert code == 0, err
    return cmp / "report" / "index.html"


captions = figure_texts


def restored(run_dir: Path) -> Restored:
    r = restore(load(run_dir))
    assert isinstance(r, Restored), r
    return r


# ---- the figures ----------------------------------------------------------------------------
@pytest.mark.slow
def test_report_writes_both_figures(page):
    out = page.parent
    text = page.read_text()
    for file in ("forecast-pcfedh-s0.png", "forecast-fedprox-s0.png", "prototypes-pcfedh-s0.png"):
        image = imread(out / file)
        assert image[..., :3].std() > 0.05, file  # lines, points and text drawn
        assert f'data-file="{file}"' in text, file
    assert not (out / "prototypes-fedprox-s0.png").exists()  # no encoder in FedProx's state
    caps = captions(page)
    fc = caps["forecast-pcfedh-s0.png"]
    first = restored(page.parent.parent / "pcfedh-s0").data.clients[0].client_id
    assert "Fig. 4" in fc and f"client {first}," in fc and "checkpoint.npz of round 3" in fc
    assert "bpm" in fc and "Skipped" not in fc and "skipped" not in fc
    assert "body and head the client's own" in fc  # PCFedH's personal predictor
    assert "the same global model for every client" in caps["forecast-fedprox-s0.png"]
    tsne = caps["prototypes-pcfedh-s0.png"]
    assert "Fig. 3" in tsne and f"Windows: {WINDOWS} of the " in tsne
    assert "TSEncoder(input_dims=1, output_dims=10, hidden_dims=16, depth=1)" in tsne
    for title in ("Heart rate over time", "t-SNE of PCFedH encoder features"):
        assert f"<h2>{title}" in text


def independent_predictions(run_dir: Path, client: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True bpm, predicted bpm and target times (s) of ``client``'s test windows, from the
    run's files through PCFedH's own hooks (not the report's code)."""
    cfg = load_config(run_dir / "config.yaml")
    data = load_federated(cfg.dataset, cfg.dataset.seed if cfg.dataset.seed is not None else cfg.seed)
    ckpt = load_checkpoint(run_dir / "checkpoint.npz")
    method = build_method(Task.of(cfg, data))
    c = next(c for c in data.clients if c.client_id == client)
    down = method.evaluation_message(ckpt["server"], client, ckpt["round"])
    pred = method.personal_predictor(down, ckpt["clients"][client])  # PCFedH personalizes nothing
    with torch.no_grad():
        out = pred(torch.from_numpy(c.test.x)).numpy()[:, 0].astype(np.float64)
    shift, scale = data.target
    assert scale == 100.0  # dataset.normalize=fixed: outputs are HR / 100
    t = (c.test.start + data.window) / data.rate_hz
    return c.test.y.astype(np.float64) * scale + shift, out * scale + shift, t


@pytest.mark.parametrize("which", [None, 1])
def test_predicted_series_is_the_personal_predictor(cmp, which):
    """Default (None): the first training client; else the training client at that index."""
    run_dir = cmp / "pcfedh-s0"
    r = restored(run_dir)
    want_client = r.data.clients[which or 0].client_id
    fc = client_forecast(r, None if which is None else want_client)
    assert not isinstance(fc, Skipped), fc
    assert fc.client == want_client
    true, pred, t = independent_predictions(run_dir, want_client)
    np.testing.assert_allclose(fc.true_bpm, true, rtol=1e-6)
    np.testing.assert_allclose(fc.pred_bpm, pred, rtol=1e-5)
    np.testing.assert_allclose(fc.time_s, t)
    assert 50 < true.mean() < 150  # bpm, not HR / 100
    # the lines drawn are those numbers (synthetic_hr: one recording, no gap)
    ax = forecast_figure(fc).axes[0]
    true_line, pred_line = ax.lines
    np.testing.assert_allclose(true_line.get_xdata(), t)
    np.testing.assert_allclose(true_line.get_ydata(), true, rtol=1e-6)
    np.testing.assert_allclose(pred_line.get_ydata(), pred, rtol=1e-5)
    # and what the run itself measured for this client at that round
    m = pd.read_csv(run_dir / "metrics.csv")
    row = m[(m["round"] == fc.round) & (m["view"] == "personalized") & (m["split"] == "test")
            & (m["client"].astype(str) == want_client)].iloc[0]
    for k in ("mse", "mae", "mape"):
        assert fc.errors[k] == pytest.approx(row[k], rel=1e-5), k
        assert fc.logged[k] == row[k]


@pytest.mark.slow
def test_client_option(cmp, tmp_path):
    data = restored(cmp / "fedprox-s0").data
    last = data.clients[-1].client_id
    code, _, err = report(cmp / "fedprox-s0", "--client", last, "--out", str(tmp_path / "a"))
    assert code == 0, err
    caps = captions(tmp_path / "a" / "index.html")
    assert f"client {last}," in caps["forecast-fedprox-s0.png"]
    code, _, err = report(cmp / "fedprox-s0", "--client", "nobody", "--out", str(tmp_path / "b"))
    assert code == 0, err
    cap = captions(tmp_path / "b" / "index.html")["forecast-fedprox-s0.png"]
    assert "skipped fedprox seed 0: client 'nobody' is not a client of this run" in cap
    new = data.new_clients[0].client_id  # tiny_regression_config holds 2 clients out
    fc = client_forecast(restored(cmp / "fedprox-s0"), new)
    assert isinstance(fc, Skipped) and "held-out new client" in fc.reason


def test_tsne_features_are_the_encoders(cmp):
    r = restored(cmp / "pcfedh-s0")
    f = encoder_features(r, 40)
    assert f is not None and not isinstance(f, Skipped)
    x = np.concatenate([c.train.x for c in r.data.clients])
    idx = sample(len(x), 40)
    assert len(set(idx)) == 40 and f.total == len(x) and len(f.z) == 40
    arrays = r.checkpoint["server"].arrays
    # the method's own feature function, with its own encoder object
    method = build_method(Task.of(r.cfg, r.data))
    want = method.features(method.load_encoder(Record(arrays)), torch.from_numpy(x[idx])).numpy()
    np.testing.assert_allclose(f.z, want, rtol=1e-5, atol=1e-6)
    enc = TSEncoder(1, 10, 16, 1)
    enc.load_state_dict({k[4:]: torch.from_numpy(v) for k, v in arrays.items() if k.startswith("enc.")})
    with torch.no_grad():
        z = instance_representation(enc.eval()(torch.from_numpy(x[idx]))).numpy()
    np.testing.assert_allclose(f.z, z, rtol=1e-5, atol=1e-6)
    protos = arrays["proto"] / np.linalg.norm(arrays["proto"], axis=1, keepdims=True)
    np.testing.assert_array_equal(f.nearest, (z @ protos.T).argmax(1))
    np.testing.assert_allclose(f.raw, x[idx].reshape(40, -1))
    assert encoder_features(restored(cmp / "fedprox-s0")) is None  # no encoder: no figure


@pytest.mark.slow
def test_run_without_checkpoint_is_skipped(cmp, tmp_path):
    run = tmp_path / "pcfedh-s0"
    shutil.copytree(cmp / "pcfedh-s0", run, ignore=shutil.ignore_patterns("report"))
    (run / "checkpoint.npz").unlink()
    code, _, err = report(run)
    assert code == 0, err
    caps = captions(run / "report" / "index.html")
    assert "skipped pcfedh seed 0: no checkpoint.npz in pcfedh-s0" in caps["forecast-pcfedh-s0.png"]
    assert "skipped pcfedh seed 0: no checkpoint.npz" in caps["prototypes-pcfedh-s0.png"]


@pytest.mark.slow
def test_missing_data_folder(cmp, tmp_path):
    """Without --root a missing data folder skips the figures; a wrong --root is an error."""
    run = tmp_path / "run"
    shutil.copytree(cmp / "fedprox-s0", run, ignore=shutil.ignore_patterns("report"))
    tree = yaml.safe_load((run / "config.yaml").read_text())
    tree["dataset"].update(name="ppg_dalia_hr", root=str(tmp_path / "nowhere"))
    (run / "config.yaml").write_text(yaml.safe_dump(tree))
    code, _, err = report(run)
    assert code == 0, err
    cap = captions(run / "report" / "index.html")["forecast-fedprox-s0.png"]
    assert "nowhere" in cap and "--root" in cap
    code, _, err = report(run, "--root", str(tmp_path / "elsewhere"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "elsewhere" in err


@pytest.mark.slow
def test_no_forecast_loads_nothing(cmp, tmp_path, monkeypatch):
    from fedwear.report import embeddings

    def boom(*args, **kwargs):
        raise AssertionError("data loaded with --no-forecast")

    monkeypatch.setattr(embeddings, "load_federated", boom)
    code, _, err = report(cmp, "--no-forecast", "--out", str(tmp_path / "page"))
    assert code == 0, err
    names = {p.name for p in (tmp_path / "page").glob("*.png")}
    assert names and not {n for n in names if n.startswith(("forecast-", "prototypes-"))}
    code, _, err = report(cmp, "--no-forecast", "--root", str(tmp_path))
    assert code == 2 and "--root is only used with --embeddings" in err


# ---- the rest of the report on a regression run ---------------------------------------------
def test_embeddings_of_a_regression_run_are_coloured_by_client(cmp, tmp_path):
    """--embeddings on forecasters: no class to colour by (HR / 100 cast to int is no class)."""
    from fedwear.report.embeddings import Embeddings, embedding_plot, run_embeddings

    e = run_embeddings(load(cmp / "fedprox-s0"))
    assert isinstance(e, Embeddings) and e.colour == "client"
    assert [e.class_names[k] for k in e.y] == e.client.tolist()
    plot = embedding_plot(load(cmp).runs, tmp_path)
    assert "coloured by the client" in plot.caption
    assert "Regression runs (a forecast target has no class): colour: the client." in plot.notes
    assert "Skipped" not in plot.text


@pytest.mark.slow
def test_units_of_a_regression_report(page):
    assert axis_label("mse") == "MSE (bpm²)" and axis_label("mae") == "MAE (bpm)"
    assert axis_label("mape") == "MAPE (%)" and axis_label("accuracy") == "accuracy (%)"
    text = page.read_text()
    for row in ("MSE (bpm²)", "MAE (bpm)", "MAPE (%)"):
        assert f'<td class="l">{row}</td>' in text
    assert units_note(["mse", "mae", "mape"]) in text
    assert "accuracy" not in units_note(["mse", "mae", "mape"])
    names = {p.name for p in page.parent.glob("*.png")}
    assert {"distribution-mse.png", "distribution-mae.png", "distribution-mape.png", "curves.png",
            "headline.png", "cost.png"} <= names
    assert "distribution-n_train.png" not in names  # a window count, not a metric
    assert not any(n.startswith(("confusion-", "f1-")) for n in names)  # no classes
    curves = captions(page)["curves.png"]
    assert "Naive forecasts (grey)" in curves and "from 0 to the highest value + 10 %" in curves
    views = re.findall(r'<td class="l">(personalized|last_value|client_mean)</td>', text)
    assert views[:3] == ["personalized", "last_value", "client_mean"]  # the tables' order


@pytest.mark.slow
def test_classification_report_has_no_forecast_figures(tmp_path, monkeypatch):
    """A classification run's report: the same figures as before (and nothing of the regression
    modules runs)."""
    from fedwear.report import build

    def boom(*args, **kwargs):
        raise AssertionError("regression figures drawn for a classification run")

    monkeypatch.setattr(build, "regression_plots", boom)
    fedwear.run(tiny_config(rounds=2, **{"evaluation.views": "[personalized]"}), tmp_path / "run")
    code, _, err = report(tmp_path / "run")
    assert code == 0, err
    names = {p.name for p in (tmp_path / "run" / "report").glob("*.png")}
    metrics = ("accuracy", "macro_f1", "auc")
    assert names == {"headline.png", "curves.png", *(f"distribution-{m}.png" for m in metrics),
                     "confusion-personalized.png", "f1-personalized.png", "cost.png",
                     "bytes_up.png", "bytes_down.png", "train_loss.png", "wall_time.png"}
    text = (tmp_path / "run" / "report" / "index.html").read_text()
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text)  # figures may spell anything
    assert "bpm" not in text and units_note(metrics) in text
    assert units_note(metrics).startswith("accuracy, macro-F1 and AUC in %; any other metric")


def test_cli_default_matches():
    from fedwear.report import prototypes

    cli_report = importlib.import_module("fedwear.cli.report")  # the package's `report` is the command
    assert cli_report.TSNE_WINDOWS == prototypes.TSNE_WINDOWS
    assert forecast_mod.VIEW == "personalized"


def test_tsne_features_without_cre_are_the_raw_windows(tmp_path):
    """Table 3's w/o CRE clusters raw windows: its figure uses them, not the untrained encoder."""
    run = tmp_path / "pcfedh-no_cre-s0"
    fedwear.run(tiny_regression_config(method="pcfedh", **{"method_options.pcfedh": {**PCFEDH, "ablation": "no_cre"}}),
                run)
    r = restored(run)
    f = encoder_features(r, 40)
    assert f is not None and not isinstance(f, Skipped) and "raw windows" in f.encoder
    x = np.concatenate([c.train.x for c in r.data.clients])
    x = x[sample(len(x), 40)]
    method = build_method(Task.of(r.cfg, r.data))
    want = method.features(method.load_encoder(Record(r.checkpoint["server"].arrays)), torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(f.z, want, rtol=1e-5, atol=1e-6)
    assert f.protos.shape[1] == f.z.shape[1]
