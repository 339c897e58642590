"""PCFedH: the proximal term's gradient and its pull by u_ik in the local step, the plan from
select to aggregate, module 1's server invariants, the phases and a short run on synthetic
series."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import fedwear
from fedwear.data import load_federated
from fedwear.methods import Record, Task, build_method
from fedwear.methods.api import Selection
from fedwear.methods.pcfedh import CATEGORISE, LOCAL_PROTO, MODULE1, PROTO, SOFT
from fedwear.methods.proximal import centres as stacked
from fedwear.methods.proximal import proximal
from fedwear.methods.soft_clustering import CLUSTER, U, V
from tests.helpers import tiny_regression_config

OPTIONS = {"pcl_rounds": 1, "clusters": 2, "per_cluster": 2, "encoder_epochs": 1, "crop_margin": 4}


def method_and_data(**options):
    cfg = tiny_regression_config(**{"method": "pcfedh", "method_options.pcfedh": {**OPTIONS, **options}})
    data = load_federated(cfg.dataset, cfg.seed)
    return build_method(Task.of(cfg, data)), data


def test_proximal_gradient_is_the_weighted_pull() -> None:
    torch.manual_seed(0)
    w = [torch.randn(3, 2, requires_grad=True), torch.randn(4, requires_grad=True)]
    centres = [[torch.randn(3, 2), torch.randn(4)] for _ in range(3)]
    u = np.array([0.5, 0.3, 0.2])
    value = proximal(w, stacked(centres), torch.as_tensor(u, dtype=torch.float32), lam=0.1)
    value.backward()
    expected_value = 0.05 * sum(u[k] * sum(((p - c) ** 2).sum() for p, c in zip(w, centres[k], strict=True)) for k in range(3))
    torch.testing.assert_close(value, expected_value.detach().float())
    for i, p in enumerate(w):
        expected = 0.1 * sum(u[k] * (p.detach() - centres[k][i]) for k in range(3))
        torch.testing.assert_close(p.grad, expected)


def test_soft_fit_pulls_towards_the_clusters_of_the_client() -> None:
    """Algorithm 2's local step (Eq. 12): the proximal pull goes to the cluster models in
    proportion to the client's u_ik; without it (lambda = 0), u changes nothing."""

    def fit(u: list[float], reg_weight: float) -> dict[str, np.ndarray]:
        m, data = method_and_data(reg_weight=reg_weight)
        names = [n for n, _ in m.model.named_parameters()]
        down = Record({CLUSTER.format(k) + n: np.full_like(m.initial[n], sign) for k, sign in ((0, 1.0), (1, -1.0))
                       for n in names})
        up, _ = m.fit_predictor(down, Record({**m.initial, U: np.array(u)}), data.clients[0], seed=3)
        return {n: up.arrays[n] for n in names}

    to_plus, to_minus = fit([1.0, 0.0], 1.0), fit([0.0, 1.0], 1.0)
    assert all((to_plus[n] - to_minus[n]).mean() > 0 for n in to_plus)  # towards +1 vs towards -1
    a, b = fit([1.0, 0.0], 0.0), fit([0.0, 1.0], 0.0)
    assert all(np.array_equal(a[n], b[n]) for n in a)


def test_module1_counts_against_the_clients_own_last_centroids_in_the_code() -> None:
    """The code's client counts its windows against the centroids its own K-means step left in
    the previous round (SPECS 1.3 S1, clients.py); the paper's against the global prototypes."""
    for variant in ("code", "paper"):
        m, data = method_and_data(variant=variant)
        client = data.clients[0]
        first, state = m.fit(m.configure(m.init_server(), client.client_id, 1), Record(), client, 1, seed=1)
        np.testing.assert_array_equal(state.arrays[LOCAL_PROTO], first.arrays[PROTO])
        down = Record({k: v for k, v in first.arrays.items() if k != "counts"})
        down.arrays[PROTO] = first.arrays[PROTO][::-1].copy()  # the global prototypes differ from its own
        seen = []
        real = m.counts
        m.counts = lambda d, c, centres=None, seen=seen, real=real: seen.append(centres) or real(d, c, centres)
        m.fit_encoder(down, state, client, seed=2)
        if variant == "code":
            np.testing.assert_array_equal(seen[0], first.arrays[PROTO])
        else:
            assert seen == [None]


def test_phases_and_evaluation_rounds() -> None:
    m, _ = method_and_data(pcl_rounds=3)
    assert [m.phase(r) for r in range(1, 7)] == [MODULE1] * 3 + [CATEGORISE] + [SOFT] * 2
    due = [r for r in range(1, 215) if m.evaluation_due(r, every=100, last=214)]
    assert due == [104, 204, 214]  # phase-2 rounds 100, 200 and the last (SPECS 1.4: t = 99, 199, ...)


def test_module1_server_step_code_and_paper() -> None:
    for variant in ("code", "paper"):
        m, _ = method_and_data(variant=variant)
        server = m.init_server()
        encs = [k for k in server.arrays if k.startswith("enc.")]
        enc = encs[0]

        def encoder(value: float, encs: list[str] = encs, server: Record = server) -> dict[str, np.ndarray]:
            return {k: np.full_like(server.arrays[k], value) for k in encs}

        replies = {
            "a": Record({**encoder(1.0), PROTO: np.eye(2, m.feature_dim, dtype=np.float32),
                         "density": np.array([0.1, 0.3], np.float32), "counts": np.array([3.0, 0.0])},
                        {"num_examples": 3}),
            "b": Record({**encoder(4.0), PROTO: np.eye(2, m.feature_dim, k=1, dtype=np.float32),
                         "density": np.array([0.2, 0.2], np.float32), "counts": np.array([1.0, 8.0])},
                        {"num_examples": 9}),
        }
        out = m.aggregate(server, replies, 1)
        if variant == "code":  # unweighted encoder mean; prototypes weighted by the clients' shares
            np.testing.assert_allclose(out.arrays[enc], 2.5)
            v = np.array([[3.0, 3e-4], [1.0, 8.0]]) / np.array([[4.0, 8.0003]])
            np.testing.assert_allclose(out.arrays["density"], (v * [[0.1, 0.3], [0.2, 0.2]]).sum(0), rtol=1e-5)
        else:  # the paper: n_i-weighted encoder, plain mean of prototypes
            np.testing.assert_allclose(out.arrays[enc], (3 * 1 + 9 * 4) / 12, rtol=1e-6)
            np.testing.assert_allclose(out.arrays["density"], [0.15, 0.25], rtol=1e-6)


def test_select_hands_its_plan_to_aggregate() -> None:
    m, data = method_and_data()
    ids = [c.client_id for c in data.clients]
    server = m.init_server()
    shares = np.tile([0.0, 1.0], (len(ids), 1))
    shares[:3] = [1.0, 0.0]  # cluster 0 lives on the first three clients only
    server.arrays.update({V + c: shares[i] / shares[:, :].sum(0) for i, c in enumerate(ids)})
    sel = m.select(server, 5, [], ids)
    assert isinstance(sel, Selection) and set(sel.plan) == {"0", "1"}
    assert set(sel.plan["0"]) <= set(ids[:3]) and set(sel.plan["1"]) <= set(ids[3:])
    assert all(len(set(g)) == 2 for g in sel.plan.values())
    assert m.select(server, 5, [], ids) == sel  # the draw is the round's, reproducible
    keys = list(m.cluster_initial[0])
    replies = {c: Record({k: np.full_like(m.initial[k], float(i)) for k in keys}, {"num_examples": 1})
               for i, c in enumerate(ids) if c in sel.clients}
    out = m.aggregate(server, replies, 5, sel.plan)
    for k, group in sel.plan.items():
        expected = np.mean([ids.index(c) for c in group])
        np.testing.assert_allclose(out.arrays[f"cluster{k}.{keys[0]}"], expected)


def test_short_run_goes_through_the_phases(tmp_path: Path) -> None:
    cfg = tiny_regression_config(**{"method": "pcfedh", "rounds": 5, "method_options.pcfedh": OPTIONS,
                                    "evaluation.every": 1})
    res = fedwear.run(cfg, tmp_path / "r", quiet=True)
    rounds = pd.read_csv(tmp_path / "r" / "rounds.csv")
    n = 6  # training clients
    assert rounds["n_clients"].tolist()[:2] == [n, n]  # module 1 and the categorisation: everyone
    assert all(k <= 2 * 2 for k in rounds["n_clients"].tolist()[2:])  # K clusters x M clients at most
    assert sorted(res.metrics["round"].unique()) == [3, 4, 5]  # only soft-clustering rounds are evaluated
    log = (tmp_path / "r" / "run.log").read_text()
    assert "round 2/5: 6 clients, no training loss," in log  # the categorisation round trains nothing
    assert "train loss" in next(line for line in log.splitlines() if "round 3/5:" in line)
    again = fedwear.run(cfg, tmp_path / "again", quiet=True)
    pd.testing.assert_frame_equal(res.metrics, again.metrics)  # bit for bit


@pytest.mark.parametrize("ablation", ["no_pcl", "no_cre", "no_sc"])
def test_ablations_run(tmp_path: Path, ablation: str) -> None:
    cfg = tiny_regression_config(**{"method": "pcfedh", "rounds": 3,
                                    "method_options.pcfedh": {**OPTIONS, "ablation": ablation}})
    res = fedwear.run(cfg, tmp_path / ablation, quiet=True)
    assert np.isfinite(res.metrics["mse"]).all()


def test_rounds_ending_in_the_clustering_phase_are_warned_with_the_rounds_needed(tmp_path: Path,
                                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """``--set rounds=3`` on a PCFedH config used to run only module 1 and evaluate nothing, silently."""
    cfg = tiny_regression_config(**{"method": "pcfedh", "rounds": 2, "evaluation.every": 1,
                                    "method_options.pcfedh": {**OPTIONS, "pcl_rounds": 3}})
    with caplog.at_level("WARNING", logger="fedwear"):
        fedwear.run(cfg, tmp_path / "r", quiet=True)
    said = [r.getMessage() for r in caplog.records if "ends before" in r.getMessage()]
    assert said == ["rounds=2 ends before pcfedh evaluates any round (evaluation.every=1): set rounds >= 5"]
    assert said[0] in (tmp_path / "r" / "run.log").read_text()


def test_a_run_that_evaluates_is_not_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = tiny_regression_config(**{"method": "pcfedh", "rounds": 3, "evaluation.every": 5,
                                    "method_options.pcfedh": OPTIONS})
    with caplog.at_level("WARNING", logger="fedwear"):
        fedwear.run(cfg, tmp_path / "r", quiet=True)
    assert not [r for r in caplog.records if "ends before" in r.getMessage()]
    assert (pd.read_csv(tmp_path / "r" / "metrics.csv")["round"] == 3).any()


def test_the_clustering_phase_shows_its_progress_and_estimate_from_its_first_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bar and run.log speak during module 1, long before its first round ends: the phase, each
    client's steps, and how long the round and the phase will take, from the first steps."""
    from fedwear.callbacks import Progress, RunLog
    from fedwear.engines.runner import Callback

    monkeypatch.setattr(RunLog, "ESTIMATE_MIN_S", 0.0)
    monkeypatch.setattr(Progress, "SHOW_ESTIMATE_S", 0.0)
    seen: list[str] = []

    class FirstSteps(Callback):  # run.log and the bars when round 1's first client is at its 5th step
        def on_start(self, runner):
            self.t0 = time.perf_counter()

        def on_step(self, runner, round, client, step, planned):
            if round == 1 and step == RunLog.STEPS_TO_ESTIMATE and not seen:
                seen.append(time.perf_counter() - self.t0)
                bar = next(cb for cb in runner.callbacks if isinstance(cb, Progress))
                tasks = {t.id: t for t in bar.bar.tasks}
                seen.append((tmp_path / "r" / "run.log").read_text())
                seen.append(tasks[bar.task].description)
                seen.append(tasks[bar.clients].fields["acc"])

    cfg = tiny_regression_config(**{"method": "pcfedh", "rounds": 4, "method_options.pcfedh": {**OPTIONS, "pcl_rounds": 2}})
    fedwear.run(cfg, tmp_path / "r", quiet=False, callbacks=[FirstSteps()])
    after, log, title, under = seen
    assert after < 30.0  # seconds from the start of round 1
    assert "phases: clustering (module 1): rounds 1-2; categorisation: round 3; soft clustering (module 2): round 4" in log
    line = next(ln for ln in log.splitlines() if "estimated from its first measurements" in ln)
    assert "round 1/4 (clustering (module 1), rounds 1-2)" in line and "after 5 of client" in line
    assert "for this round, ~" in line and line.endswith("for the phase")
    assert title == "pcfedh on synthetic_hr: clustering (module 1)"
    assert re.fullmatch(r"\S+: step \d+/\d+ \| round ~[\d.]+ (s|min|h) left, clustering \(module 1\) ~[\d.]+ (s|min|h) left", under), under


def test_phase_clock_estimates_from_the_steps_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedwear.callbacks import PhaseClock
    from fedwear.methods.api import Phase

    now = [0.0]
    monkeypatch.setattr("fedwear.callbacks.time.perf_counter", lambda: now[0])
    clock = PhaseClock([Phase("a", 1, 3), Phase("b", 4, 9)])
    clock.round_start(1, ["c1", "c2", "c3", "c4"])
    assert clock.round_left() is None  # nothing measured yet
    now[0] = 5.0
    clock.step_taken(5, 10)  # 1 s a step: 5 more for c1, 10 for each of the 3 others
    assert clock.round_left() == 35.0 and clock.phase_left() == 35.0 + 2 * 40.0
    now[0] = 12.0
    clock.reply()  # c1 took 12 s: the others at that pace
    assert clock.round_left() == 36.0
    clock.round_end(1, 48.0)
    clock.round_start(2, ["c1"])
    now[0] = 14.0
    clock.step_taken(1, 4)  # 2 s a step, 3 more; round 3 at the median of finished rounds (48 s)
    assert clock.round_left() == 6.0 and clock.phase_left() == 6.0 + 48.0
    assert clock.phase(4).name == "b" and clock.phase(99).name == "b"


def test_phase_clock_counts_a_clients_setup_once_not_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedwear.callbacks import PhaseClock
    from fedwear.methods.api import Phase

    now = [0.0]
    monkeypatch.setattr("fedwear.callbacks.time.perf_counter", lambda: now[0])
    clock = PhaseClock([Phase("a", 1, 1)])
    clock.round_start(1, ["c1", "c2"])
    for step in range(1, 6):  # 10 s of setup before step 1, then 0.5 s a step
        now[0] = 10.0 + 0.5 * step
        clock.step_taken(step, 100)
    # c1: 95 more steps at 0.5 s; c2 like c1 as a whole: 12.5 s so far + 47.5 s left
    assert clock.round_left() == 47.5 + 60.0
