"""``fedwear report --embeddings``: t-SNE of body embeddings from each method's last checkpoint."""

from __future__ import annotations

import html
import json
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
from fedwear.callbacks import CHECKPOINT, load_checkpoint
from fedwear.cli import app
from fedwear.methods import Task, build_method
from fedwear.methods.training import load_arrays
from fedwear.report.embeddings import (
    FILE,
    POINTS,
    body_embeddings,
    embedding_plot,
    load_data,
    run_config,
)
from fedwear.report.rundir import load
from tests.helpers import figure_texts, tiny_config

METHODS = ("fedavg", "local")


def report(path: Path, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, ["report", str(path), *args])
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory) -> Path:
    """fedavg and local, 2 rounds, seed 0 (and fedavg seed 1, which must not be drawn)."""
    root = tmp_path_factory.mktemp("emb") / "cmp"
    for method in METHODS:
        fedwear.run(tiny_config(method=method, rounds=2), root / f"{method}-s0")
    fedwear.run(tiny_config(method="fedavg", rounds=2, seed=1), root / "fedavg-s1")
    return root


@pytest.fixture(scope="module")
def page(compare_dir) -> Path:
    code, out, err = report(compare_dir, "--embeddings")
    assert code == 0, err
    index = compare_dir / "report" / "index.html"
    assert out.strip().splitlines()[-1] == str(index)
    return index


@pytest.mark.slow
def test_embeddings_png_and_page(page):
    png = page.parent / FILE
    assert png.is_file()
    image = imread(png)
    height, width = image.shape[:2]
    assert 300 <= height <= 2700 and width in (1050, 2148), (width, height)  # a column's width at 300 dpi
    assert image[..., :3].std() > 0.05  # not blank: points and text drawn
    text = page.read_text()
    assert f'data-file="{FILE}"' in text
    caption = figure_texts(page)[FILE]
    assert "checkpoint.npz of round 2 (the final round)" in caption
    for method in METHODS:
        assert f"{method} seed 0: checkpoint.npz of round 2" in caption
    assert "seed 1" not in caption
    assert "test-split windows" in caption and "perplexity" in caption
    assert "the same global model for every client" in caption  # fedavg
    assert "body and head the client's own" in caption  # local
    assert "data: synthetic (generated, no files)" in caption
    assert "Skipped" not in caption


def test_without_flag_no_embeddings(compare_dir, tmp_path, monkeypatch):
    """Without --embeddings nothing of this module runs (no data, no checkpoint is read)."""
    from fedwear.report import build, embeddings

    def boom(*args, **kwargs):
        raise AssertionError("embeddings computed without --embeddings")

    monkeypatch.setattr(embeddings, "embedding_plot", boom)
    monkeypatch.setattr(embeddings, "load_federated", boom)
    monkeypatch.setattr(build, "all_plots", lambda groups, out, **options: [])  # the other figures: test_report
    code, _, err = report(compare_dir, "--out", str(tmp_path / "page"))
    assert code == 0, err
    assert not (tmp_path / "page" / FILE).exists()
    assert FILE not in (tmp_path / "page" / "index.html").read_text()
    code, _, err = report(compare_dir, "--root", str(tmp_path))
    assert code == 2 and "--root is only used with --embeddings" in err


def test_global_model_embeddings_equal_server_features(compare_dir):
    run = compare_dir / "fedavg-s0"
    cfg = run_config(run)
    data = load_data(cfg)
    ckpt = load_checkpoint(run / "checkpoint.npz")
    assert ckpt["round"] == 2
    method = build_method(Task.of(cfg, data))
    bodies = body_embeddings(method, ckpt, data.clients, cfg)
    assert not bodies.kept  # FedAvg's evaluation keeps nothing: the checkpoint's model is the scored one
    got = bodies.z
    assert list(got) == [c.client_id for c in data.clients]

    model = build_method(Task.of(cfg, data)).new_model()  # a model object of its own
    load_arrays(model, ckpt["server"].arrays)
    model.eval()
    for c in data.clients:
        with torch.no_grad():
            want = model.features(torch.from_numpy(c.test.x)).numpy()
        assert got[c.client_id].shape == want.shape == (len(c.test), 16)
        np.testing.assert_allclose(got[c.client_id], want, rtol=1e-5, atol=1e-6)


def test_trained_personal_models_are_the_embeddings_and_a_paused_run_says_why_not(tmp_path):
    """``personal_model: trained``: each client's embeddings come from its trained model in the
    checkpoint (as the run evaluated it), not the global one; a paused run's checkpoint leaves those
    models out (the next round rebuilds them), so it gets a reason instead of other embeddings."""
    from fedwear.api import run

    cfg = tiny_config(rounds=3, clients_per_round=6, **{"evaluation.personal_model": "trained"})
    run(cfg, tmp_path / "r", until=2)
    data = load_data(cfg)
    method = build_method(Task.of(cfg, data))
    paused = body_embeddings(method, load_checkpoint(tmp_path / "r" / "checkpoint.npz"), data.clients, cfg)
    assert isinstance(paused, str) and "paused run" in paused
    run(cfg, tmp_path / "r", resume=True)
    ckpt = load_checkpoint(tmp_path / "r" / "checkpoint.npz")
    got = body_embeddings(method, ckpt, data.clients, cfg).z
    c = data.clients[0]
    model = build_method(Task.of(cfg, data)).new_model()
    load_arrays(model, {k.removeprefix("trained."): v for k, v in ckpt["clients"][c.client_id].arrays.items()})
    model.eval()
    with torch.no_grad():
        want = model.features(torch.from_numpy(c.test.x)).numpy()
        glob = build_method(Task.of(cfg, data)).new_model()
        load_arrays(glob, ckpt["server"].arrays)
        glob.eval()
        other = glob.features(torch.from_numpy(c.test.x)).numpy()
    np.testing.assert_allclose(got[c.client_id], want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got[c.client_id], other)


def test_run_without_checkpoint_is_skipped(compare_dir, tmp_path):
    cmp = tmp_path / "cmp"
    for method in METHODS:
        shutil.copytree(compare_dir / f"{method}-s0", cmp / f"{method}-s0",
                        ignore=shutil.ignore_patterns("report"))
    (cmp / "local-s0" / "checkpoint.npz").unlink()
    plot = embedding_plot(load(cmp).runs, tmp_path)
    assert (tmp_path / FILE).is_file() and plot.file == FILE
    assert "Skipped local seed 0: no checkpoint.npz in local-s0" in plot.text
    assert "fedavg seed 0: checkpoint.npz of round 2" in plot.text
    assert "local seed 0: checkpoint" not in plot.text


def test_saved_points_redraw_a_finished_run_without_its_checkpoint(compare_dir, tmp_path):
    """A run folder kept without checkpoints (as results/runs keeps them) keeps its panel."""
    first = embedding_plot(load(compare_dir).runs, tmp_path)
    points = json.loads((tmp_path / POINTS).read_text())
    assert [(p["method"], p["seed"]) for p in points["panels"]] == [("fedavg", 0), ("local", 0)]
    assert len(points["panels"][0]["xy"]) == len(points["panels"][0]["y"]) > 0
    kept = tmp_path / "kept"
    for method in METHODS:
        shutil.copytree(compare_dir / f"{method}-s0", kept / f"{method}-s0",
                        ignore=shutil.ignore_patterns("report", "checkpoint.npz"))
    again = embedding_plot(load(kept).runs, tmp_path)
    assert again.text == first.text and "Skipped" not in again.text
    assert json.loads((tmp_path / POINTS).read_text()) == points
    # a panel of another config (or final round) is not the run's: drawn again, here impossible
    points["panels"][1]["config_hash"] = "other"
    (tmp_path / POINTS).write_text(json.dumps(points))
    third = embedding_plot(load(kept).runs, tmp_path)
    assert "Skipped local seed 0: no checkpoint.npz" in third.text and "Skipped fedavg" not in third.text


@pytest.mark.slow
def test_missing_dataset_root_is_one_line_error(compare_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(compare_dir / "fedavg-s0", run, ignore=shutil.ignore_patterns("report"))
    tree = yaml.safe_load((run / "config.yaml").read_text())
    tree["dataset"].update(name="usc_had", root=str(tmp_path / "nowhere"))
    (run / "config.yaml").write_text(yaml.safe_dump(tree))
    code, _, err = report(run, "--embeddings")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "dataset.root" in err and "nowhere" in err and "--root" in err
    code, _, err = report(run, "--embeddings", "--root", str(tmp_path / "elsewhere"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--root" in err and "elsewhere" in err


# ---- methods whose evaluation personalizes (Personalized: budgets, a kept state) -------------
BUDGETED = {
    "fedreptile": {},
    "metahar": {"optimizer.name": "adam", "optimizer.lr": 0.001, "batch_size": 16,
                "method_options.metahar.finetune_epochs": 1, "dataset.drop_classes": 1},
    "fedmat": {"model.name": "fedmat", "model.options": {"filters": 32, "hidden": 8}, "optimizer.name": "adam",
               "optimizer.lr": 0.001, "dataset.drop_classes": 1, "batch_size": 16,
               "dataset.synthetic.channels": 6},
}


def budgeted_config(method: str):
    """2 rounds, the personalized view only (its budgets' curves are the report's figures)."""
    return tiny_config(method=method, rounds=2, **BUDGETED[method], **{"evaluation.views": "[personalized]"})


def scores(pred, c, cfg, num_classes: int) -> dict[str, float]:
    """The classification metrics of ``pred`` on ``c``'s test windows, computed apart from the
    engine's evaluator: own forward pass, a per-client head's logits mapped back to global labels."""
    from fedwear.engines.client import ABSENT_LOGIT, forward
    from fedwear.evaluation.metrics import classification_metrics
    from fedwear.evaluation.predictor import as_predictor

    pred = as_predictor(pred)
    logits = forward(pred, c.test.x, 7, pred.device).float().numpy()  # batches of 7: not the engine's
    if pred.classes is not None:
        full = np.full((len(logits), num_classes), ABSENT_LOGIT, np.float32)
        full[:, list(pred.classes)] = logits
        logits = full
    return classification_metrics(c.test.y, logits, cfg.evaluation.auc)


def logged(run_dir: Path, round: int, view: str, client: str) -> dict[str, float]:
    m = pd.read_csv(run_dir / "metrics.csv")
    row = m[(m["round"] == round) & (m["view"] == view) & (m["split"] == "test") & (m["client"] == client)]
    assert len(row) == 1, (round, view, client)
    return row.iloc[0].to_dict()


@pytest.fixture(scope="module")
def budgeted_dir(tmp_path_factory) -> Path:
    """Tiny runs of FedReptile and Meta-HAR, whose ``personalize`` returns Personalized."""
    root = tmp_path_factory.mktemp("emb") / "budgeted"
    for method in ("fedreptile", "metahar"):
        fedwear.run(budgeted_config(method), root / f"{method}-s0")
    return root


@pytest.mark.slow
def test_embeddings_of_methods_whose_evaluation_personalizes(budgeted_dir):
    code, _, err = report(budgeted_dir, "--embeddings")
    assert code == 0, err
    caption = figure_texts(budgeted_dir / "report" / "index.html")[FILE]
    assert "fedreptile seed 0: checkpoint" in caption and "view personalized@k3." in caption
    assert "metahar seed 0: checkpoint" in caption and "view personalized@n3." in caption
    # Meta-HAR keeps each user's head: the checkpoint's model is not the one metrics.csv scored
    assert "metahar's evaluation keeps a state on each client" in caption
    assert "fedreptile's evaluation keeps" not in caption  # optimizer.persist off: nothing kept
    assert "Skipped" not in caption
    points = json.loads((budgeted_dir / "report" / POINTS).read_text())
    assert {(p["method"], p["view"], p["kept"]) for p in points["panels"]} == {
        ("fedreptile", "personalized@k3", False), ("metahar", "personalized@n3", True)}


@pytest.mark.slow  # FedMAT's conv3d networks: ~20 s here
def test_fedmat_embeddings_say_why_there_is_no_panel(tmp_path):
    """FedMAT's predictor is the whole user model (its masks read the shared network's
    activations, so no body output alone feeds the head): a panel that says so, exit 0."""
    fedwear.run(budgeted_config("fedmat"), tmp_path / "fedmat-s0")
    code, _, err = report(tmp_path, "--embeddings")
    assert code == 0, err
    text = html.unescape((tmp_path / "report" / "index.html").read_text())
    assert "Skipped fedmat seed 0: its personal predictor has no separate body" in text


def test_drawn_model_is_the_one_the_engine_scored(budgeted_dir):
    """FedReptile keeps nothing between evaluations: each client's model rebuilt from the final
    checkpoint gives exactly the numbers metrics.csv holds for it (view personalized@k3)."""
    from fedwear.report.embeddings import drawn_view, personal_model

    run = budgeted_dir / "fedreptile-s0"
    cfg = run_config(run)
    data = load_data(cfg)
    method = build_method(Task.of(cfg, data))
    ckpt = load_checkpoint(run / CHECKPOINT)
    assert drawn_view(method) == "personalized@k3"
    for c in data.clients[:2]:
        pred, kept = personal_model(method, ckpt, c, cfg)
        assert not kept
        got, want = scores(pred, c, cfg, data.num_classes), logged(run, ckpt["round"], "personalized@k3", c.client_id)
        assert got["accuracy"] == want["accuracy"] and got["macro_f1"] == want["macro_f1"], c.client_id
        assert got["auc"] == pytest.approx(want["auc"], abs=1e-12)


@pytest.mark.parametrize("method", ["metahar", pytest.param("fedmat", marks=pytest.mark.slow)])
def test_entry_point_replays_the_engines_evaluation_of_a_kept_state(method, tmp_path):
    """Meta-HAR and FedMAT keep a state from one evaluation to the next: given the state a client
    held before round 2's evaluation (a client that did not train in round 2: its state of the
    round-1 checkpoint) and round 2's message, ``evaluated_predictors`` gives the very numbers
    metrics.csv holds for every budget at round 2; from the round-2 checkpoint (the state that
    evaluation kept), the report says it personalises once more."""
    from fedwear.api import run
    from fedwear.engines.client import evaluated_predictors
    from fedwear.report.embeddings import personal_model

    cfg = budgeted_config(method)
    out = tmp_path / "r"
    run(cfg, out, until=1)
    before = load_checkpoint(out / CHECKPOINT)
    run(cfg, out, resume=True)
    after = load_checkpoint(out / CHECKPOINT)
    assert (before["round"], after["round"]) == (1, 2)
    data = load_data(cfg)
    method_obj = build_method(Task.of(cfg, data))
    trained_in_2 = pd.read_csv(out / "rounds.csv").set_index("round").loc[2, "clients"].split(";")
    c = next(c for c in data.clients if c.client_id not in trained_in_2)
    down = method_obj.evaluation_message(after["server"], c.client_id, 2)
    personal, keep = evaluated_predictors(method_obj, down, before["clients"][c.client_id], c, cfg, 2)
    assert keep is not None
    seen = []
    for budget, pred in personal:  # each predictor used before the next is built
        got, want = scores(pred, c, cfg, data.num_classes), logged(out, 2, f"personalized@{budget}", c.client_id)
        assert got["accuracy"] == want["accuracy"] and got["macro_f1"] == want["macro_f1"], budget
        assert got["auc"] == pytest.approx(want["auc"], abs=1e-12), budget
        seen.append(budget)
    assert seen == list(method_obj.budgets)
    assert personal_model(method_obj, after, c, cfg)[1]  # kept: the caption says so
