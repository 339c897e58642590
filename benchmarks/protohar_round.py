"""CPU time of one FedAvg round of ProtoHAR's USC-HAD protocol: fedwear vs the authors' code.

    python benchmarks/protohar_round.py --authors /tmp/protohar_code \
        --root ../shared/data/usc_had --rounds 6 --repeats 3
    python benchmarks/protohar_round.py --authors /tmp/protohar_code \
        --root ../shared/data/usc_had --whole-process --long 4 --repeats 1

(a) fedwear: the packaged ``protohar_usc_had.yaml`` (the code-faithful protocol) with
``method=fedavg`` and all three evaluation views (personalized, generalization, global) every
round; (b) the authors' code (github cheng-haha/ProtoHAR, ``main.py --algorithm FedAvg`` with
the flags of its runexp.sh, ``--device -1``), whose USC-HAD split must already be prepared with
its own ``data/uschad/uschad_subdata.py`` (``--dataset_dir`` = the raw USC-HAD folder). This
script downloads nothing and changes nothing in ``--authors`` except what the authors' code
itself writes there (its ``runs/`` and ``work_dir/`` logs).

Each repeat runs (a) then (b), each in a fresh subprocess with one thread
(``torch.set_num_threads(1)``, OMP/MKL_NUM_THREADS=1), so background load hits both alike.
A round's CPU time is the ``time.process_time()`` between round boundaries inside the child:
fedwear round r = local training of round r + evaluation of its model (a callback on the
runner); authors' round r = ``evaluate()`` at the start of its round r + local training (the
boundaries are the calls of ``Server.evaluate``, wrapped from outside; the last ends at
``save_results``). The medians skip round 1 of both (and fedwear's at-start round 0).

``--whole-process`` measures the second way, as ``/usr/bin/time`` would: each side's process CPU
(user + sys) of a ``--long``-round child minus that of a 1-round child, over ``--long - 1``, after
one unmeasured warm-up child per side; everything a process does per round counts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import types
from importlib import resources
from pathlib import Path

MARK = "PROTOHAR_ROUND_JSON "
VIEWS = "[personalized,generalization,global]"
# runexp.sh's FedAvg line, with --device -1 (CPU) and the round count of the benchmark.
AUTHORS_ARGS = ["--dataset", "uschad", "--algorithm", "FedAvg", "--batch_size", "32", "--local_epochs", "5",
                "--sampleratio", "0.15", "--lamda", "0.1", "--learning_rate", "0.001", "--model", "cnn",
                "--personal_learning_rate", "0.01", "--times", "1", "--device", "-1", "--niid", "20k2p",
                "--slog", "--total_users", "14"]


def _cpu() -> float:
    return time.process_time()


# ---- (a) fedwear ------------------------------------------------------------------------------

def fedwear_child(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    import fedwear
    import fedwear.engines.client as client_mod
    from fedwear.config import load_config
    from fedwear.engines.runner import Callback, Runner
    from fedwear.engines.sim import SimExecutor

    cfg_path = resources.files("fedwear.reproduce") / "configs" / "protohar_usc_had.yaml"
    overrides = ["method=fedavg", f"evaluation.views={VIEWS}", f"dataset.root={args.root}", "threads=1",
                 f"rounds={args.rounds}", *args.set]
    cfg = load_config(str(cfg_path), overrides)

    acc = {"train": 0.0, "eval": 0.0, "eval_windows": 0}
    fit, evaluate, forward = SimExecutor.fit, Runner.evaluate, client_mod.forward

    def timed_fit(self, *a, **k):
        t = _cpu()
        try:
            return fit(self, *a, **k)
        finally:
            acc["train"] += _cpu() - t

    def timed_evaluate(self, *a, **k):
        t = _cpu()
        try:
            return evaluate(self, *a, **k)
        finally:
            acc["eval"] += _cpu() - t

    def counted_forward(fn, x, batch_size, device="cpu"):
        if not isinstance(x, torch.Tensor):  # windows (a head over cached features gets a tensor)
            acc["eval_windows"] += len(x)
        return forward(fn, x, batch_size, device)

    SimExecutor.fit, Runner.evaluate, client_mod.forward = timed_fit, timed_evaluate, counted_forward

    rounds: list[dict] = []

    class CpuPerRound(Callback):
        def on_start(self, runner):
            self.t = _cpu()
            self.train_sizes = {cid: len(rt.data.train) for cid, rt in runner.executor.trainers.items()}

        def on_round(self, runner, info):
            now = _cpu()
            n = [self.train_sizes[c] for c in info.clients]
            e = cfg.local_epochs
            rounds.append({"round": info.round, "cpu_s": now - self.t, "wall_s": info.wall_s,
                           "train_cpu_s": acc["train"], "eval_cpu_s": acc["eval"],
                           "train_windows": e * sum(n), "train_steps": e * sum(math.ceil(k / cfg.batch_size) for k in n),
                           "eval_windows": acc["eval_windows"]})
            acc.update(train=0.0, eval=0.0, eval_windows=0)
            self.t = now

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.process_time)

        class ProfileOneRound(Callback):
            def on_round(self, runner, info):
                if info.round == args.profile:
                    profiler.enable()
                elif info.round == args.profile + 1:
                    profiler.disable()

    with tempfile.TemporaryDirectory() as tmp:
        cbs = [CpuPerRound()] + ([ProfileOneRound()] if profiler else [])
        fedwear.run(cfg, Path(tmp) / "run", callbacks=cbs)
    if profiler is not None:
        import pstats

        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    return {"side": "fedwear", "rounds": rounds}


# ---- (b) the authors' code ----------------------------------------------------------------------

def authors_child(args: argparse.Namespace) -> dict:
    import runpy

    import torch

    torch.set_num_threads(1)
    code = Path(args.authors).resolve()
    split = code / "data" / "uschad" / "20k_14b_2p_data" / "train"
    if not split.is_dir():
        sys.exit(f"{split} missing: run the authors' data/uschad/uschad_subdata.py --dataset_dir <USC-HAD> first")
    os.chdir(code)
    sys.path.insert(0, str(code))
    for name in ("ujson", "h5py"):  # imported at module level, used only to save results (off: --nsr)
        try:
            __import__(name)
        except ImportError:
            sys.modules[name] = types.ModuleType(name)
    from FLAlgorithms.servers.serverbase import Server
    from FLAlgorithms.users.useravg import UserAVG
    from FLAlgorithms.users.userbase import User

    marks: list[float] = []
    acc = {"train": 0.0, "eval": 0.0, "train_windows": 0, "train_steps": 0, "eval_windows": 0}
    rounds: list[dict] = []
    evaluate, train, save_results = Server.evaluate, UserAVG.train, Server.save_results
    test, train_error = User.test, User.train_error_and_loss

    def close_round() -> None:
        now = _cpu()
        if marks:
            rounds.append({"round": len(marks), "cpu_s": now - marks[-1], "train_cpu_s": acc["train"],
                           "eval_cpu_s": acc["eval"], "train_windows": acc["train_windows"],
                           "train_steps": acc["train_steps"], "eval_windows": acc["eval_windows"]})
        acc.update(train=0.0, eval=0.0, train_windows=0, train_steps=0, eval_windows=0)
        marks.append(now)

    def timed_evaluate(self, *a, **k):
        close_round()  # the authors' round starts with evaluate()
        t = _cpu()
        try:
            return evaluate(self, *a, **k)
        finally:
            acc["eval"] += _cpu() - t

    def timed_train(self, epochs, *a, **k):
        t = _cpu()
        try:
            return train(self, epochs, *a, **k)
        finally:
            acc["train"] += _cpu() - t
            acc["train_windows"] += self.local_epochs * self.train_samples
            acc["train_steps"] += self.local_epochs * len(self.trainloader)

    def counted_test(self, *a, **k):
        acc["eval_windows"] += self.test_samples
        return test(self, *a, **k)

    def counted_train_error(self, *a, **k):
        acc["eval_windows"] += self.train_samples  # forward over the train set, with autograd on
        return train_error(self, *a, **k)

    def timed_save(self, *a, **k):
        close_round()
        return save_results(self, *a, **k)

    Server.evaluate, UserAVG.train, Server.save_results = timed_evaluate, timed_train, timed_save
    User.test, User.train_error_and_loss = counted_test, counted_train_error
    sys.argv = ["main.py", *AUTHORS_ARGS, "--num_global_iters", str(args.rounds), "--nsr"]
    runpy.run_path(str(code / "main.py"), run_name="__main__")
    return {"side": "authors", "rounds": rounds}


# ---- arithmetic limit ----------------------------------------------------------------------------

def flop_limit(train_windows: float, eval_windows: float) -> str:
    """FLOPs of the HARCNN (FlopCounterMode: convolutions and matmuls) per window of a training
    step (batch 32) and of a forward pass (batch 64), and the CPU-s they need at the rate a
    one-thread 1024x1024 float32 matmul reaches on this machine (a practical ceiling)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from fedwear.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("harcnn", 512, 6, 12)
    x, y = torch.randn(32, 512, 6), torch.randint(0, 12, (32,))
    with FlopCounterMode(display=False) as fc:
        F.cross_entropy(model(x), y).backward()
    train = fc.get_total_flops() / 32
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model.eval()
        model(torch.randn(64, 512, 6))
    fwd = fc.get_total_flops() / 64
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    t, n = time.process_time(), 20
    for _ in range(n):
        a @ b
    rate = n * 2 * 1024**3 / (time.process_time() - t)
    need = (train * train_windows + fwd * eval_windows) / rate
    return (f"HARCNN: {train / 1e6:.1f} MFLOP per window of a training step, {fwd / 1e6:.1f} MFLOP per window "
            f"forward; one-thread sgemm here: {rate / 1e9:.1f} GFLOP/s; so {train_windows:.0f} trained + "
            f"{eval_windows:.0f} evaluated windows need >= {need:.2f} CPU-s at that rate")


# ---- parent -------------------------------------------------------------------------------------

def run_child(side: str, args: argparse.Namespace, rounds: int | None = None) -> tuple[dict, float]:
    """The child's result and its whole process's CPU (user + sys, as ``/usr/bin/time`` counts it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--authors", str(args.authors),
           "--root", str(Path(args.root).resolve()), "--rounds", str(rounds or args.rounds)]
    cmd += [f"--set={s}" for s in args.set]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"{side} child failed ({out.returncode}):\n{out.stderr[-4000:]}")
    line = next(x for x in reversed(out.stdout.splitlines()) if x.startswith(MARK))
    total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(line[len(MARK):]), total


def whole_process(args: argparse.Namespace) -> None:
    """The second way: each side's process CPU (user + sys) of a ``--long``-round run minus that
    of a 1-round run, over ``--long - 1``: a round's cost with everything a process does per
    round (logging, result files, evaluation), start-up and the final round's extras cancelled.
    One unmeasured 1-round warm-up per side first (file caches); then per repeat the sides'
    pairs interleaved (fedwear 1, authors 1, fedwear long, authors long)."""
    for side in ("fedwear", "authors"):
        run_child(side, args, 1)
    cpu: dict[str, dict[int, list[float]]] = {s: {1: [], args.long: []} for s in ("fedwear", "authors")}
    for rep in range(args.repeats):
        for rounds in (1, args.long):
            for side in ("fedwear", "authors"):
                cpu[side][rounds].append(run_child(side, args, rounds)[1])
                print(f"repeat {rep} {side} {rounds} rounds: {cpu[side][rounds][-1]:.1f} CPU-s", file=sys.stderr, flush=True)
    print(f"whole-process CPU (user + sys), {args.repeats} repeats, 1 and {args.long} rounds, a warm-up run first\n")
    print(f"| side | 1 round, CPU-s (median) | {args.long} rounds, CPU-s (median) | CPU-s a round |")
    print("|---|---:|---:|---:|")
    per = {}
    for side, runs in cpu.items():
        one, long = statistics.median(runs[1]), statistics.median(runs[args.long])
        per[side] = (long - one) / (args.long - 1)
        print(f"| {side} | {one:.1f} | {long:.1f} | {per[side]:.2f} |")
    print(f"\nfedwear / authors (whole-process CPU a round): {per['fedwear'] / per['authors']:.2f}")


def stats(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--authors", required=True, help="the authors' code, its USC-HAD split prepared")
    ap.add_argument("--root", default="../shared/data/usc_had", help="raw USC-HAD (fedwear's dataset.root)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", type=int, default=1, help="rounds 1..skip left out of the medians (warm-up)")
    ap.add_argument("--set", action="append", default=[], help="extra fedwear overrides")
    ap.add_argument("--whole-process", action="store_true",
                    help="measure the second way: process CPU of --long rounds minus 1 round, per round")
    ap.add_argument("--long", type=int, default=4, help="with --whole-process: rounds of the long run")
    ap.add_argument("--child", choices=["fedwear", "authors"], help=argparse.SUPPRESS)
    ap.add_argument("--profile", type=int, default=0,
                    help="with --child fedwear: cProfile round N+1 (printed to stderr)")
    args = ap.parse_args()
    if args.child:
        res = fedwear_child(args) if args.child == "fedwear" else authors_child(args)
        print(MARK + json.dumps(res), flush=True)
        return
    if args.whole_process:
        whole_process(args)
        return

    per_side: dict[str, list[dict]] = {"fedwear": [], "authors": []}
    totals: dict[str, list[float]] = {"fedwear": [], "authors": []}
    for rep in range(args.repeats):
        for side in ("fedwear", "authors"):
            res, total = run_child(side, args)
            kept = [r for r in res["rounds"] if r["round"] > args.skip]
            per_side[side] += kept
            totals[side].append(total)
            print(f"repeat {rep} {side}: " + ", ".join(f"r{r['round']} {r['cpu_s']:.2f}" for r in res["rounds"])
                  + f" CPU-s; process total {total:.1f} CPU-s", file=sys.stderr, flush=True)

    print(f"rounds {args.rounds}, repeats {args.repeats} (interleaved fedwear, authors), "
          f"rounds 1..{args.skip} (and fedwear's round 0) left out\n")
    print("| side | CPU-s/round median | min | max | train CPU-s median | eval CPU-s median | rounds | "
          "train windows/round (steps) | eval windows/round | process CPU-s median |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = {}
    for side, rows in per_side.items():
        cpu = [r["cpu_s"] for r in rows]
        med[side] = statistics.median(cpu)
        tw = statistics.median(r["train_windows"] for r in rows)
        ts = statistics.median(r["train_steps"] for r in rows)
        ew = statistics.median(r["eval_windows"] for r in rows)
        print(f"| {side} | {stats(cpu)} | {statistics.median(r['train_cpu_s'] for r in rows):.2f} | "
              f"{statistics.median(r['eval_cpu_s'] for r in rows):.2f} | {len(rows)} | {tw:.0f} ({ts:.0f}) | "
              f"{ew:.0f} | {statistics.median(totals[side]):.1f} |")
    print(f"\nfedwear / authors (median CPU-s per round): {med['fedwear'] / med['authors']:.2f}\n")
    for side, rows in per_side.items():
        per_window = [r["train_cpu_s"] / r["train_windows"] * 1000 for r in rows if r["train_windows"]]
        tw = statistics.median(r["train_windows"] for r in rows)
        ew = statistics.median(r["eval_windows"] for r in rows)
        print(f"- {side}: training {statistics.median(per_window):.2f} CPU-ms per window-epoch; "
              f"{flop_limit(tw, ew)}")


if __name__ == "__main__":
    main()
