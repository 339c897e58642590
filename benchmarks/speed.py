"""Speed and scale: fixed workloads, fedwear's engines side by side with a reference loop.

    python benchmarks/speed.py --workload all --root /work/shared/data/usc_had \\
        --hapt-root /work/shared/data/uci_hapt --repeats 2 --out perf.md

Workloads (named, fixed configs built below; ``--rounds`` overrides their round counts):

1. ProtoHAR's USC-HAD protocol: the packaged ``protohar_usc_had.yaml``, ``method=fedavg`` (with
   the reference loop) and ``method=protohar``; evaluation every round (``--root``).
2. FedAvg with all 30 UCI HAPT clients every round (``--hapt-root``).
3. Many clients, a tiny model: PCFedH's phase-2 LSTM(1 -> 10) on 150 x 1 synthetic windows,
   200 clients, 50 a round.
4. Scale: 1,000 and 10,000 synthetic clients, 1% a round, fedwear's small ``cnn`` with each
   client's optimiser state kept, 20 rounds with an evaluation of every client after the last;
   ``client_states`` memory and disk (``flower-sim`` at 1,000 only).

Sides: ``reference`` (FedAvg the way PFLlib / FL-bench run it: ``benchmarks/reference_loop.py``),
fedwear ``sim``, ``batched`` and ``flower-sim`` (``engine=...`` through ``fedwear.run``). Each
repeat runs every side of every workload once, each in a fresh subprocess with one torch thread
(``torch.set_num_threads(1)``, OMP/MKL_NUM_THREADS=1), sides in reverse order on odd repeats; the
tables give medians over the rounds after round ``skip`` of all repeats. A side that fails or
times out is reported as ``n/a`` with the reason.

Measured per round, at round boundaries inside the child (a runner callback; the reference loop
times itself the same way): wall seconds, CPU seconds of the child and all its descendant
processes (Ray's, for ``flower-sim``), the evaluation part (``Runner.evaluate``), optimiser
steps summed over clients; per child: peak RSS (for ``flower-sim`` the sum over the process tree,
sampled at round ends), data loading time, start-up (time to the end of round 1, less loading
and a steady round).

Arithmetic limit: FLOPs per window of a training step (forward + backward) and of an evaluation
forward pass, counted with ``torch.utils.flop_counter.FlopCounterMode`` on the workload's model
(an ``nn.LSTM`` is counted through a step-by-step copy of its computation, which
FlopCounterMode can see into); a round's necessary work is its local training plus one forward
pass over every client's test windows when it evaluates. Divided by a one-thread float32
1024x1024 matmul rate measured in the same run (a subprocess per repeat; median), that is the
FLOP-bound CPU-s per round; "% of limit" = FLOP-bound CPU-s / measured CPU-s.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

MARK = "SPEED_JSON "
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# ---- workloads --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    key: str
    workload: int
    title: str
    sides: tuple[str, ...]
    rounds: int
    every: int | None = None  # evaluation.every (None: the config's)


FEDWEAR = ("sim", "batched", "flower-sim")
SCALE_SIDES = ("reference", "sim/memory", "sim/disk", "batched/memory", "batched/disk")


def cases(workload: str, rounds: int | None) -> list[Case]:
    r = rounds
    all_cases = [
        Case("1-fedavg", 1, "ProtoHAR's USC-HAD protocol, FedAvg", ("reference", *FEDWEAR), r or 4),
        Case("1-protohar", 1, "ProtoHAR's USC-HAD protocol, ProtoHAR", FEDWEAR, r or 4),
        Case("2-hapt30", 2, "FedAvg, all 30 UCI HAPT clients every round", ("reference", *FEDWEAR), r or 4),
        Case("3-lstm", 3, "Many clients, tiny LSTM (PCFedH phase-2 shape)", ("reference", *FEDWEAR), r or 4),
        Case("4-1000", 4, "1,000 synthetic clients, 1% a round", (*SCALE_SIDES, "flower-sim"), r or 20, r or 20),
        Case("4-10000", 4, "10,000 synthetic clients, 1% a round", SCALE_SIDES, r or 20, r or 20),
    ]
    wanted = {1, 2, 3, 4} if workload == "all" else {int(w) for w in workload.split(",")}
    return [c for c in all_cases if c.workload in wanted]


def _synthetic(subjects: int, seconds: float) -> dict:
    return {"name": "synthetic", "window": 150, "stride": 150, "normalize": "client", "split": "stratified",
            "test_fraction": 0.25, "held_out": 0,
            "synthetic": {"num_subjects": subjects, "num_classes": 4, "channels": 1, "rate_hz": 1.0,
                          "seconds_per_class": seconds}}


def base_config(case: Case, args: argparse.Namespace) -> dict:
    """The case's config as a dict (before the side's engine settings)."""
    from fedwear.config import load_config

    common = {"threads": 1, "checkpoint_every": 0, "seed": 0}
    if case.workload == 1:
        path = resources.files("fedwear.reproduce") / "configs" / "protohar_usc_had.yaml"
        if not args.root:
            sys.exit("workload 1 needs --root (the USC-HAD folder)")
        method = case.key.split("-", 1)[1]
        cfg = load_config(str(path), [f"method={method}", f"dataset.root={Path(args.root).resolve()}",
                                      "evaluation.at_start=false"])
        tree = cfg.model_dump(mode="json")
        tree.update(common)
    elif case.workload == 2:
        if not args.hapt_root:
            sys.exit("workload 2 needs --hapt-root (the UCI HAPT folder, with RawData/)")
        tree = {**common, "method": "fedavg", "clients_per_round": 1.0, "local_epochs": 1, "batch_size": 32,
                "dataset": {"name": "uci_hapt", "root": str(Path(args.hapt_root).resolve()),
                            "classes": [0, 1, 2, 3, 4, 5], "window": 128, "stride": 64, "normalize": "client",
                            "split": "time", "test_fraction": 0.3, "held_out": 0},
                "model": {"name": "cnn"}, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
                "evaluation": {"every": 1, "views": ["global"]}}
    elif case.workload == 3:
        tree = {**common, "method": "fedavg", "clients_per_round": 50, "local_epochs": 5, "batch_size": 64,
                "dataset": _synthetic(200, 6000.0), "model": {"name": "lstm"},
                "optimizer": {"name": "adam", "lr": 0.01},
                "evaluation": {"every": 1, "views": ["global"]}}
    else:
        n = int(case.key.split("-")[1])
        tree = {**common, "method": "fedavg", "clients_per_round": 0.01, "local_epochs": 5, "batch_size": 32,
                "dataset": _synthetic(n, 1500.0), "model": {"name": "cnn"},
                "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "persist": True},
                "evaluation": {"views": ["global"]}}
    tree["rounds"] = case.rounds
    if case.every is not None:
        tree["evaluation"]["every"] = case.every
    tree["dataset"]["cache_dir"] = str(Path(args.cache) / case.key) if args.cache else None
    return tree


def side_config(case: Case, side: str, args: argparse.Namespace):
    from fedwear.config import load_config

    tree = base_config(case, args)
    engine, _, states = side.partition("/")
    if engine != "reference":
        tree["engine"] = engine
    if states:
        tree["client_states"] = states
    return load_config(data=tree)


def describe(case: Case, args: argparse.Namespace) -> str:
    """One line: what the case's config is."""
    from fedwear.config import load_config

    c = load_config(data=base_config(case, args))
    d, o = c.dataset, c.optimizer
    size = f"{d.synthetic.num_subjects} subjects" if d.name == "synthetic" else f"root {d.root}"
    return (f"`{c.method}` on `{d.name}` ({size}, window {d.window}, stride {d.stride or d.window}, split "
            f"{d.split}); model `{c.model.name}`; clients per round {c.clients_per_round}; {c.local_epochs} "
            f"local epochs, batch {c.batch_size}; {o.name} lr {o.lr}"
            + (f" momentum {o.momentum}" if o.name == "sgd" else "")
            + f"{', optimiser state kept per client' if o.persist else ''}; grad clip {c.grad_clip}; "
            f"evaluation every {c.evaluation.every} round(s), views {', '.join(c.evaluation.views)}; "
            f"{c.rounds} rounds; no checkpoints")


# ---- measuring ----------------------------------------------------------------------------------

def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            fields = _stat_fields(int(d))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(d))
    out, todo = [], list(children.get(root, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


class Meter:
    """CPU seconds and RSS of this process plus its descendants (Ray's processes)."""

    def __init__(self, tree: bool) -> None:
        self.tree = tree

    def cpu(self) -> float:
        total = time.process_time()
        if self.tree:
            for pid in descendants(os.getpid()):
                f = _stat_fields(pid)
                if f is not None:
                    total += (int(f[11]) + int(f[12])) / TICKS
        return total

    def rss_mb(self) -> float:
        """RSS of this process; with descendants, the sum of their proportional set sizes (PSS:
        shared pages split between the processes sharing them, so none counts twice)."""
        if not self.tree:
            f = _stat_fields(os.getpid())
            return int(f[21]) * PAGE / 2**20 if f else math.nan
        total = 0
        for pid in [os.getpid(), *descendants(os.getpid())]:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as fh:
                    total += next(int(x.split()[1]) for x in fh if x.startswith("Pss:")) * 1024
            except (OSError, StopIteration):
                pass
        return total / 2**20


def kernel() -> tuple[float, int]:
    """System CPU seconds and minor page faults of this process so far."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_stime, u.ru_minflt


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def head_epochs(cfg) -> int:
    from fedwear.methods import parse_options

    return int(getattr(parse_options(cfg.method, cfg.method_options.get(cfg.method)), "head_epochs", 0))


def round_counts(cfg, sizes: dict[str, int], clients: list[str]) -> dict:
    n = [sizes[c] for c in clients]
    he = head_epochs(cfg)
    steps = (cfg.local_epochs + he) * sum(math.ceil(k / cfg.batch_size) for k in n)
    return {"clients": len(n), "steps": steps, "train_windows": cfg.local_epochs * sum(n),
            "head_windows": he * sum(n)}


# ---- children ---------------------------------------------------------------------------------

def fedwear_child(case: Case, side: str, args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    import fedwear
    import fedwear.api as api
    from fedwear.engines.runner import Callback, Runner

    cfg = side_config(case, side, args)
    meter = Meter(tree=cfg.engine == "flower-sim")
    out: dict = {"rounds": []}
    t_run = time.perf_counter()
    load = api.load_federated

    def timed_load(*a, **k):
        t = time.perf_counter()
        data = load(*a, **k)
        out["load_s"] = time.perf_counter() - t
        out["data"] = data
        return data

    api.load_federated = timed_load
    acc = {"wall": 0.0, "cpu": 0.0}
    evaluate = Runner.evaluate

    def timed_evaluate(self, *a, **k):
        t, c = time.perf_counter(), meter.cpu()
        try:
            return evaluate(self, *a, **k)
        finally:
            acc["wall"] += time.perf_counter() - t
            acc["cpu"] += meter.cpu() - c

    Runner.evaluate = timed_evaluate
    profiler = Profiler(args.profile_round) if args.profile_round else None

    class Clock(Callback):
        def on_start(self, runner):
            data = out["data"]
            self.sizes = {c.client_id: len(c.train) for c in runner.method.training_clients(data)}
            self.test = sum(len(c.test) for c in data.clients)
            ex = runner.executor
            out["executor"] = type(ex).__name__
            states = getattr(ex, "states", None)
            if states is not None:
                out["executor"] += f" ({type(states).__name__} states)"
            self.wall, self.cpu, self.kernel = time.perf_counter(), meter.cpu(), kernel()
            out["to_start_s"] = self.wall - t_run
            acc.update(wall=0.0, cpu=0.0)

        def on_round(self, runner, info):
            now, cpu, (sys_s, faults) = time.perf_counter(), meter.cpu(), kernel()
            if profiler is not None:
                profiler.boundary(info.round)
            evaluated = runner.evaluation_due(info.round)
            out["rounds"].append({"round": info.round, "wall_s": now - self.wall, "cpu_s": cpu - self.cpu,
                                  "sys_s": sys_s - self.kernel[0], "faults": faults - self.kernel[1],
                                  "eval_wall_s": acc["wall"], "eval_cpu_s": acc["cpu"], "evaluated": evaluated,
                                  "eval_windows": self.test if evaluated else 0, "rss_mb": meter.rss_mb(),
                                  "end_s": now - t_run, **round_counts(cfg, self.sizes, info.clients)})
            acc.update(wall=0.0, cpu=0.0)
            self.wall, self.cpu, self.kernel = time.perf_counter(), meter.cpu(), kernel()

        def on_end(self, runner):
            out["peak_rss_mb"] = max([peak_rss_mb()] + [r["rss_mb"] for r in out["rounds"]])
            if cfg.client_states == "memory" and hasattr(runner.executor, "client_states"):
                states = runner.executor.client_states()
                if isinstance(states, Mapping):
                    out["states"] = {"clients": len(states), "bytes": sum(s.nbytes for s in states.values())}

    with tempfile.TemporaryDirectory() as tmp:
        res = fedwear.run(cfg, Path(tmp) / "run", callbacks=[Clock()])
        m = res.metrics
        last = m[(m["round"] == m["round"].max()) & (m["split"] == "test")]
        view = "global" if (last["view"] == "global").any() else "personalized"
        last = last[last["view"] == view]
        out["accuracy"] = float((last["accuracy"] * last["n"]).sum() / last["n"].sum())
        out["accuracy_view"] = view
    out.pop("data")
    if profiler is not None:
        profiler.report()
    return out


def reference_child(case: Case, args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE))
    from reference_loop import ReferenceFedAvg

    from fedwear.data import load_federated

    cfg = side_config(case, "reference", args)
    meter = Meter(tree=False)
    out: dict = {"rounds": [], "executor": "reference loop"}
    t_run = time.perf_counter()
    data = load_federated(cfg.dataset, cfg.dataset.seed if cfg.dataset.seed is not None else cfg.seed)
    out["load_s"] = time.perf_counter() - t_run
    ref = ReferenceFedAvg(cfg, data)
    sizes = {c.client_id: len(c.train) for c in data.clients}
    test = sum(len(c.test) for c in data.clients)
    profiler = Profiler(args.profile_round) if args.profile_round else None
    wall, cpu, k0 = time.perf_counter(), meter.cpu(), kernel()
    for r in range(1, cfg.rounds + 1):
        ref.train_round(r)
        ev_wall = ev_cpu = 0.0
        evaluated = ref.evaluation_due(r)
        if evaluated:
            t, c = time.perf_counter(), meter.cpu()
            stats = ref.evaluate()
            ev_wall, ev_cpu = time.perf_counter() - t, meter.cpu() - c
            out["accuracy"], out["accuracy_view"] = stats.accuracy, "global"
        now, cpu_now, k1 = time.perf_counter(), meter.cpu(), kernel()
        if profiler is not None:
            profiler.boundary(r)
        out["rounds"].append({"round": r, "wall_s": now - wall, "cpu_s": cpu_now - cpu, "sys_s": k1[0] - k0[0],
                              "faults": k1[1] - k0[1], "eval_wall_s": ev_wall,
                              "eval_cpu_s": ev_cpu, "evaluated": evaluated, "eval_windows": test if evaluated else 0,
                              "rss_mb": meter.rss_mb(), "end_s": now - t_run,
                              **round_counts(cfg, sizes, ref.schedule[r - 1])})
        wall, cpu, k0 = time.perf_counter(), meter.cpu(), kernel()
    out["peak_rss_mb"] = peak_rss_mb()
    if cfg.optimizer.persist:
        out["states"] = {"clients": len(ref.optimizer_states), "bytes": sum(
            v.numel() * v.element_size() for s in ref.optimizer_states.values() for st in s["state"].values()
            for v in st.values() if torch.is_tensor(v))}
    if profiler is not None:
        profiler.report()
    return out


def load_child(case: Case, args: argparse.Namespace) -> dict:
    """Load the case's data twice: uncached (fills the benchmark's cache), then from the cache;
    and the model's FLOPs per window."""
    import torch

    torch.set_num_threads(1)
    from fedwear.data import load_federated

    cfg = side_config(case, "sim", args)
    seed = cfg.dataset.seed if cfg.dataset.seed is not None else cfg.seed
    t = time.perf_counter()
    data = load_federated(cfg.dataset, seed)
    uncached = time.perf_counter() - t
    rss = peak_rss_mb()
    t = time.perf_counter()
    load_federated(cfg.dataset, seed)
    cached = time.perf_counter() - t
    train, fwd = flops_per_window(cfg, data.window, len(data.channels), data.num_classes)
    return {"uncached_s": uncached, "cached_s": cached, "load_peak_rss_mb": rss, "clients": len(data.clients),
            "train_windows": sum(len(c.train) for c in data.clients),
            "test_windows": sum(len(c.test) for c in data.clients),
            "x_mb": sum(c.train.x.nbytes + c.test.x.nbytes + c.val.x.nbytes for c in data.clients) / 2**20,
            "train_flops": train, "fwd_flops": fwd, "shape": [data.window, len(data.channels), data.num_classes]}


def matmul_child() -> dict:
    """Peak one-thread float32 matmul rate (best of 5 timings of 10 1024x1024 products)."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    best = 0.0
    for _ in range(5):
        t = time.process_time()
        for _ in range(10):
            a @ b
        best = max(best, 10 * 2 * 1024**3 / (time.process_time() - t))
    return {"flops_per_s": best}


class Profiler:
    """torch.profiler and cProfile over round ``n`` (from the end of round n-1 to the end of n)."""

    def __init__(self, n: int) -> None:
        import cProfile

        import torch

        self.n = n
        self.torch_prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.cprof = cProfile.Profile(time.process_time)

    def boundary(self, r: int) -> None:
        if r == self.n - 1:
            self.torch_prof.__enter__()
            self.cprof.enable()
        elif r == self.n:
            self.cprof.disable()
            self.torch_prof.__exit__(None, None, None)

    def report(self) -> None:
        import pstats

        print(self.torch_prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
        pstats.Stats(self.cprof, stream=sys.stderr).sort_stats("cumulative").print_stats(35)


# ---- FLOPs ----------------------------------------------------------------------------------------

def _unrolled_lstm(lstm):
    """A module computing ``lstm``'s output step by step with its weights (gate order i, f, g, o):
    FlopCounterMode does not see inside ``aten::lstm`` on CPU."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Unrolled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = lstm

        def forward(self, x, hx=None):
            h_in = x
            for k in range(lstm.num_layers):
                w_ih, w_hh = getattr(lstm, f"weight_ih_l{k}"), getattr(lstm, f"weight_hh_l{k}")
                xw = F.linear(h_in, w_ih, getattr(lstm, f"bias_ih_l{k}") + getattr(lstm, f"bias_hh_l{k}"))
                h = c = x.new_zeros(x.shape[0], lstm.hidden_size)
                outs = []
                for t in range(x.shape[1]):
                    i, f, g, o = (xw[:, t] + F.linear(h, w_hh)).chunk(4, 1)
                    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(c)
                    outs.append(h)
                h_in = torch.stack(outs, 1)
            return h_in, None

    return Unrolled()


def flops_per_window(cfg, window: int, channels: int, classes: int) -> tuple[float, float]:
    """FLOPs per window of a training step (batch ``batch_size``) and of an evaluation forward
    pass (batch ``evaluation.batch_size``)."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    from fedwear.models import build_model

    torch.manual_seed(0)
    model = build_model(cfg.model.name, window, channels, classes, **cfg.model.options)
    counted = copy.deepcopy(model)
    for name, module in list(counted.named_modules()):
        if isinstance(module, nn.LSTM):
            parent = counted.get_submodule(name.rsplit(".", 1)[0]) if "." in name else counted
            setattr(parent, name.rsplit(".", 1)[-1], _unrolled_lstm(module))
    x = torch.randn(4, window, channels)
    with torch.no_grad():
        assert torch.allclose(model(x), counted(x), atol=1e-5), "the FLOP-counting copy computes another function"
    b, e = cfg.batch_size, cfg.evaluation.batch_size
    with FlopCounterMode(display=False) as fc:
        F.cross_entropy(counted(torch.randn(b, window, channels)), torch.randint(0, classes, (b,))).backward()
    train = fc.get_total_flops() / b
    counted.eval()
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        counted(torch.randn(e, window, channels))
    return train, fc.get_total_flops() / e


# ---- parent -----------------------------------------------------------------------------------------

def run_child(kind: str, case: Case | None, args: argparse.Namespace) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           **dict(kv.split("=", 1) for kv in args.env)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--cache", args.cache]
    if case is not None:
        cmd += ["--case", case.key, "--rounds", str(case.rounds)]
    for flag, value in (("--root", args.root), ("--hapt-root", args.hapt_root), ("--profile-round", args.profile_round)):
        if value:
            cmd += [flag, str(value)]
    t = time.perf_counter()
    # its own process group, so that a timeout also ends the processes it started (Ray's)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"timeout after {args.timeout:.0f} s"}
    if proc.returncode != 0:
        lines = [x for x in stderr.strip().splitlines() if x.strip()]
        msg = lines[-1] if lines else f"exit status {proc.returncode}"
        return {"error": msg[:200], "stderr": stderr[-3000:]}
    if args.profile_round and stderr.strip():  # the profiles, headed by the side and case they profile
        print(f"==== profile of round {args.profile_round}: {kind} {case.key if case else ''}\n{stderr}", file=sys.stderr)
    line = next((x for x in reversed(stdout.splitlines()) if x.startswith(MARK)), None)
    if line is None:
        return {"error": "no result line", "stderr": stderr[-3000:]}
    res = json.loads(line[len(MARK):])
    res["child_wall_s"] = time.perf_counter() - t
    return res


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def startup_s(res: dict) -> float:
    """Time to the end of round 1, less data loading and a steady round of the same kind."""
    rounds = res["rounds"]
    if not rounds:
        return math.nan
    first = rounds[0]
    same = [r["wall_s"] for r in rounds[1:] if r["evaluated"] == first["evaluated"]]
    return first["end_s"] - res.get("load_s", 0.0) - (median(same) if same else first["wall_s"])


def summarise(results: list[dict], skip: int, rate: float, fpw: tuple[float, float]) -> dict:
    ok = [r for r in results if "error" not in r]
    if not ok:
        return {"error": results[0]["error"] if results else "not run"}
    rows = [r for res in ok for r in res["rounds"] if r["round"] > skip]
    train_f, fwd_f = fpw

    def train_flops(r: dict) -> float:
        return r["train_windows"] * train_f + r["head_windows"] * fwd_f

    ev = [r for r in rows if r["evaluated"]]
    return {
        "executor": ok[0].get("executor", ""),
        "wall": median([r["wall_s"] for r in rows]),
        "cpu": median([r["cpu_s"] for r in rows]),
        "train_cpu": median([r["cpu_s"] - r["eval_cpu_s"] for r in rows]),
        "eval_wall": median([r["eval_wall_s"] for r in ev]),
        "eval_cpu": median([r["eval_cpu_s"] for r in ev]),
        "steps_per_s": median([r["steps"] / max(r["wall_s"] - r["eval_wall_s"], 1e-9) for r in rows]),
        "steps": median([r["steps"] for r in rows]),
        "rss": max(res["peak_rss_mb"] for res in ok),
        "load": median([res["load_s"] for res in ok]),
        "startup": median([startup_s(res) for res in ok]),
        "bound": median([(train_flops(r) + r["eval_windows"] * fwd_f) / rate for r in rows]),
        "pct": median([(train_flops(r) + r["eval_windows"] * fwd_f) / rate / r["cpu_s"] for r in rows]),
        "train_pct": median([train_flops(r) / rate / max(r["cpu_s"] - r["eval_cpu_s"], 1e-9) for r in rows]),
        "acc": median([res["accuracy"] for res in ok if "accuracy" in res]),
        "acc_view": ok[0].get("accuracy_view", ""),
        "states": ok[0].get("states"),
        "sys": median([r["sys_s"] for r in rows if "sys_s" in r]),
        "faults": median([r["faults"] for r in rows if "faults" in r]),
        "n": len(rows),
        "failed": [r["error"] for r in results if "error" in r],
    }


def fmt(v: float, digits: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    import torch

    return f"{os.cpu_count()} cores, {model}, torch {torch.__version__}, Python {platform.python_version()}"


def tree_state() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True).stdout.split("\n")
    except OSError:
        return "unknown"
    changed = [x[3:] for x in dirty if x.strip()]
    return f"commit {head}" + (f" with uncommitted changes in {', '.join(changed)}" if changed else "")


def table(case: Case, summaries: dict[str, dict]) -> list[str]:
    ref = summaries.get("reference", {})
    lines = ["| side | executor | s/round | CPU-s/round | train CPU-s | eval s | eval CPU-s | client-steps/s | "
             "peak RSS MB | load s | start-up s | FLOP-bound CPU-s/round | % of limit | train % of limit | "
             "reference / side (CPU) | reference / side (wall) | accuracy | rounds |",
             "|---|---|" + "---:|" * 16]
    for side in case.sides:
        s = summaries[side]
        if s.get("error") == "not run":  # left out with --sides
            continue
        if "error" in s:
            lines.append(f"| {side} | n/a (error: {s['error'].replace('|', '/')}) |" + " |" * 16)
            continue
        rc = ref.get("cpu", math.nan) / s["cpu"] if "cpu" in ref else math.nan
        rw = ref.get("wall", math.nan) / s["wall"] if "wall" in ref else math.nan
        lines.append(
            f"| {side} | {s['executor']} | {fmt(s['wall'])} | {fmt(s['cpu'])} | {fmt(s['train_cpu'])} | "
            f"{fmt(s['eval_wall'])} | {fmt(s['eval_cpu'])} | {fmt(s['steps_per_s'], 0)} | {fmt(s['rss'], 0)} | "
            f"{fmt(s['load'])} | {fmt(s['startup'])} | {fmt(s['bound'], 3)} | {fmt(100 * s['pct'], 1)}% | "
            f"{fmt(100 * s['train_pct'], 1)}% | {fmt(rc)} | {fmt(rw)} | {fmt(s['acc'], 3)} | {s['n']} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="all", help="1, 2, 3, 4, a comma list, or all")
    ap.add_argument("--root", help="USC-HAD folder (workload 1)")
    ap.add_argument("--hapt-root", help="UCI HAPT folder (workload 2)")
    ap.add_argument("--rounds", type=int, help="rounds of every case (default: 4; workload 4: 20)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip", type=int, default=1, help="rounds 1..skip left out of the medians (warm-up)")
    ap.add_argument("--sides", help="only these sides (comma list, e.g. reference,sim)")
    ap.add_argument("--cases", help="only these cases of the workloads (comma list, e.g. 4-1000)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds a side's run may take")
    ap.add_argument("--out", help="write the Markdown section(s) to this file")
    ap.add_argument("--env", action="append", default=[],
                    help="KEY=VALUE set in the sides' environment (e.g. glibc's MALLOC_TRIM_THRESHOLD_)")
    ap.add_argument("--cache", help="processed-data cache folder (default: a temporary folder)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--profile-round", type=int, default=0,
                    help="torch.profiler and cProfile of that round of each side's run, on stderr")
    args = ap.parse_args()
    if args.child:
        if args.child == "matmul":
            res = matmul_child()
        else:
            case = next(c for c in cases("all", args.rounds) if c.key == args.case)
            if args.child == "load":
                res = load_child(case, args)
            elif args.child == "reference":
                res = reference_child(case, args)
            else:
                res = fedwear_child(case, args.child, args)
        print(MARK + json.dumps(res), flush=True)
        return

    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO), *sys.argv[1:]])
    selected = [c for c in cases(args.workload, args.rounds) if not args.cases or c.key in args.cases.split(",")]
    only = set(args.sides.split(",")) if args.sides else None
    tmp = None
    if not args.cache:
        tmp = tempfile.TemporaryDirectory(prefix="fedwear-speed-")
        args.cache = tmp.name
    load_start = os.getloadavg()
    t_start = time.perf_counter()
    loads = {}
    for case in selected:
        loads[case.key] = run_child("load", case, args)
        if "error" in loads[case.key]:
            sys.exit(f"{case.key}: loading the data failed: {loads[case.key]['error']}\n"
                     f"{loads[case.key].get('stderr', '')}")
        print(f"{case.key}: data {json.dumps(loads[case.key])}", file=sys.stderr, flush=True)
    results: dict[str, dict[str, list[dict]]] = {c.key: {s: [] for s in c.sides} for c in selected}
    rates = []
    for rep in range(args.repeats):
        rates.append(run_child("matmul", None, args)["flops_per_s"])
        for case in selected:
            sides = [s for s in case.sides if only is None or s in only]
            for side in (sides if rep % 2 == 0 else sides[::-1]):
                res = run_child(side, case, args)
                results[case.key][side].append(res)
                if "error" in res:
                    msg = f"failed: {res['error']}"
                else:
                    msg = ", ".join(f"r{r['round']} {r['wall_s']:.2f}s/{r['cpu_s']:.2f}cpu" for r in res["rounds"])
                print(f"repeat {rep} {case.key} {side}: {msg}", file=sys.stderr, flush=True)
    rate = median(rates)
    load_end = os.getloadavg()
    minutes = (time.perf_counter() - t_start) / 60

    md = [f"Machine: {machine()}. Tree: {tree_state()}.",
          f"Load average (1/5/15 min): {' / '.join(f'{x:.1f}' for x in load_start)} at the start, "
          f"{' / '.join(f'{x:.1f}' for x in load_end)} at the end; the run took {minutes:.1f} min.",
          f"One-thread float32 1024x1024 matmul: {rate / 1e9:.1f} GFLOP/s (median of {len(rates)}: "
          f"{', '.join(f'{r / 1e9:.1f}' for r in rates)})."
          + (f" Environment of the sides: {', '.join(args.env)}." if args.env else ""),
          "", "```bash", command, "```", ""]
    for case in selected:
        ld = loads[case.key]
        fpw = (ld["train_flops"], ld["fwd_flops"])
        summaries = {s: summarise(results[case.key][s], args.skip, rate, fpw) for s in case.sides}
        w, c, q = ld["shape"]
        md += [f"#### Workload {case.workload}: {case.title} (`{case.key}`)", "",
               describe(case, args) + ".", "",
               f"Data: {ld['clients']} clients, {ld['train_windows']} train and {ld['test_windows']} test windows "
               f"of {w} x {c} ({ld['x_mb']:.0f} MB of windows), {q} classes; loading took {ld['uncached_s']:.1f} s "
               f"uncached (peak RSS {ld['load_peak_rss_mb']:.0f} MB), {ld['cached_s']:.1f} s from the cache "
               f"(the sides load from the cache). FLOPs per window: {ld['train_flops'] / 1e6:.4g} MFLOP a training "
               f"step, {ld['fwd_flops'] / 1e6:.4g} MFLOP an evaluation forward pass.", ""]
        md += table(case, summaries)
        notes = []
        for side in case.sides:
            s = summaries[side]
            if "error" in s:
                continue
            if not math.isnan(s["sys"]):
                notes.append(f"{side}: {s['sys']:.2f} of the CPU-s per round are system time "
                             f"({s['faults'] / 1e3:.0f} k minor page faults per round" +
                             (", of the server process only)" if side == "flower-sim" else ")"))
            if s.get("states") and s["states"]["bytes"]:
                st = s["states"]
                notes.append(f"{side}: {st['clients']} client states kept, {st['bytes'] / 2**20:.1f} MB of arrays "
                             f"({st['bytes'] / max(st['clients'], 1) / 1024:.1f} KB each)")
            if s["failed"]:
                notes.append(f"{side}: {len(s['failed'])} of {args.repeats} runs failed ({s['failed'][0]})")
        if notes:
            md += ["", *(f"- {n}" for n in notes)]
        md.append("")
    text = "\n".join(md)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    raw = Path(args.out).with_suffix(".json") if args.out else None
    if raw is not None:
        raw.write_text(json.dumps({"loads": loads, "rates": rates, "results": results}, indent=1))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
