"""The prepared check for a machine with one NVIDIA GPU: under 10 minutes, no network.

    python benchmarks/gpu_check.py [--data ROOT] [--out DIR] [--rounds 4]

1. The ``gpu`` tests (``tests/test_gpu.py``): every method 2 rounds on cuda against the CPU,
   ``engine: batched`` against ``sim`` on cuda, every vectorised step against its ``fit``, and
   every method's training steps under torch's sync debug mode (no step waits for the GPU).
2. Seconds per training round (median of rounds 2 to R-1 of an R-round run, from the run's
   ``timing.csv``; round 1 warms up, round R evaluates): a ProtoHAR-protocol FedAvg round and a
   ProtoHAR round (``configs/protohar/usc_had.yaml``) on ``sim``/cuda, ``batched``/cuda and
   ``sim``/cpu, and a FedAli round on UCI HAPT (``configs/fedali/uci_hapt.yaml``) on
   ``sim``/cuda and ``batched``/cuda, with the speed-up of ``batched`` over ``sim``, and on
   ``sim``/cuda with ``compile: true`` (torch.compile of the body and head) and ``compile:
   reduce-overhead`` (its CUDA graphs); their compilation falls in round 1, which is not timed.
3. ``benchmarks/batched_crossover.py --device cuda``: where training clients together pays on
   the GPU (the rule ``VECTORIZE_MAX_TRAIN_FLOPS["cuda"]``).
4. The most clients trained together (FedAvg's step on the ProtoHAR protocol's HARCNN, batch 32,
   doubling the clients) before the GPU's memory runs out, and the time per client there.
5. A slice of ProtoHAR's Table II (``protohar:table2``: every method x 3 seeds, ``--slice-rounds``
   rounds each, evaluated at the last) on cuda with ``engine: batched``, its runs one after
   another and then as one population (``--executor together``): wall seconds of each, and the
   whole table (300 rounds) extrapolated from the population's seconds per round.

``--data``: the folder holding ``usc_had/`` and ``uci_hapt/`` (default ``$FEDWEAR_DATA``, else
``../shared/data``); a dataset missing there is replaced by fedwear's bundled UCI HAPT subset
(10 users), and the table says so. Everything goes to ``--out`` (default ``$OUT``, else a new
temporary folder; ``--out results`` to keep the record): ``gpu_check.md`` and the tests' log.
Without a GPU it says so, times the CPU rows and exits 0 (a dry run); a dry run never replaces
the record of a GPU check (it refuses an ``--out`` holding one).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import fedwear
from fedwear import files
from fedwear.config import load_config
from fedwear.data.preprocess import bundled_root
from fedwear.rundir import RunFolder

REPO = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()
NO_GPU = "none (torch sees no CUDA device: a dry run, CPU rows only)"


def data_root(given: str | None, name: str) -> tuple[Path, str]:
    """(the root of dataset ``name``, a note when it is the bundled subset instead)."""
    base = Path(given or os.environ.get("FEDWEAR_DATA") or REPO.parent / "shared" / "data")
    if (base / name).is_dir():
        return base / name, ""
    return bundled_root("uci_hapt"), f"bundled UCI HAPT subset ({name} not under {base})"


def round_seconds(config: str, root: Path, rounds: int, **sets) -> float:
    """Median wall seconds of training rounds 2..rounds-1 of ``config`` with ``sets``."""
    raw = {"rounds": rounds, "evaluation.every": 10**6, "evaluation.at_start": False, "checkpoint_every": 0,
           "dataset.root": root, **sets}
    if root.name != "usc_had":  # the same protocol on UCI HAPT
        config = config.replace("usc_had", "uci_hapt")
    cfg = load_config(REPO / config, [f"{k}={v}" for k, v in raw.items()])
    with tempfile.TemporaryDirectory() as out:
        fedwear.run(cfg, Path(out) / "run")
        timing = RunFolder(Path(out) / "run").table(files.TIMING)
    return float(timing["wall_s"].iloc[1 : rounds - 1].median())


def most_clients_together(limit: int = 4096, budget_s: float = 90.0) -> tuple[int, float]:
    """(the most clients trained together before the GPU ran out of memory, seconds per client
    there): FedAvg's batched step, HARCNN on 512 x 6 windows, 10 classes, 64 windows a client,
    1 epoch of batch 32."""
    import torch.nn.functional as F

    from fedwear.methods.fit import Fit, Stage
    from fedwear.methods.together import SGD, Client, train_together
    from fedwear.models import build_model

    torch.manual_seed(0)
    model = build_model("harcnn", 512, 6, 10).cuda()
    start = {k: p.detach().clone() for k, p in model.named_parameters()}
    best, per_client, n, began = 0, float("nan"), 8, time.time()
    while n <= limit and time.time() - began < budget_s:
        jobs = [Client(Fit.of_inputs({}), start, torch.randn(64, 512, 6), torch.randint(0, 10, (64,)), k, None)
                for k in range(n)]
        try:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            train_together(model, Stage("model", ("body", "head"), lambda m, x, y, fit: F.cross_entropy(m(x), y), 1),
                           jobs, SGD(lr=0.01, momentum=0.9, weight_decay=0.0, clip=None, batch_size=32))
            torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError:
            break
        finally:
            torch.cuda.empty_cache()
        best, per_client, n = n, (time.perf_counter() - t0) / n, n * 2
    return best, per_client


def table_slice(root: Path, rounds: int, out: Path, device: str = "cuda", seeds: tuple[int, ...] = (0, 1, 2)
                ) -> dict[str, float]:
    """Wall seconds of the ``protohar:table2`` slice, ``local`` (its runs one after another) and
    ``together`` (one population), on ``device`` with ``engine: batched``."""
    from fedwear.compare import run_grid
    from fedwear.reproduce import experiment, plan

    exp = experiment("protohar:table2")
    sets = [f"rounds={rounds}", f"device={device}", "engine=batched", f"evaluation.every={rounds}", "checkpoint_every=0"]
    seconds = {}
    for executor in ("local", "together"):
        runs = plan(exp, out / f"slice-{executor}", str(root), seeds=list(seeds), sets=sets)
        t = time.perf_counter()
        run_grid(runs, quiet=True, executor=executor)
        seconds[executor] = time.perf_counter() - t
    seconds["runs"] = len(runs)
    return seconds


def run_gpu_tests(out: Path) -> str:
    log = out / "gpu_tests.log"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-q", "-p", "no:cacheprovider"]
    with log.open("w") as sink:  # streamed, so a check stopped at its time limit still leaves the log
        done = subprocess.run(cmd, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, text=True)
    tail = [line for line in log.read_text().splitlines() if line.strip()][-1:] or ["(no output)"]
    return f"`{' '.join(cmd[2:])}`: {tail[0]} (exit {done.returncode}; log in gpu_tests.log)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="folder holding usc_had/ and uci_hapt/")
    ap.add_argument("--out", default=os.environ.get("OUT"),
                    help="folder for gpu_check.md and the tests' log (default $OUT, else a new temporary folder)")
    ap.add_argument("--slice-rounds", type=int, default=3, help="rounds of each run of the Table II slice")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per timed run (>= 3)")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="fedwear-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if CUDA else NO_GPU
    lines: list[str] = []
    report = out / "gpu_check.md"
    if not CUDA and report.is_file() and NO_GPU not in report.read_text():
        print(f"{report} records a check on a GPU; this machine has none, and its dry run would replace that "
              "record: pass another --out", file=sys.stderr)
        return 2

    def emit(*new: str) -> None:
        """Print ``new`` and rewrite the report, so a check stopped early keeps what it measured."""
        lines.extend(new)
        print("\n".join(new), flush=True)
        report.write_text("\n".join(lines) + "\n")

    emit(f"# GPU check, {datetime.date.today()}", "",
         f"Produced by `python benchmarks/gpu_check.py` (fedwear {fedwear.__version__}, torch {torch.__version__}, "
         f"Python {platform.python_version()}). GPU: {device}; CPU: {os.cpu_count()} cores.", "")
    if CUDA:
        emit("## The gpu tests", "", run_gpu_tests(out), "")
    usc, usc_note = data_root(args.data, "usc_had")
    hapt, hapt_note = data_root(args.data, "uci_hapt")
    rows = [("ProtoHAR-protocol FedAvg", "configs/protohar/usc_had.yaml", usc, usc_note, {"method": "fedavg"}),
            ("ProtoHAR", "configs/protohar/usc_had.yaml", usc, usc_note, {}),
            ("FedAli, UCI HAPT", "configs/fedali/uci_hapt.yaml", hapt, hapt_note, {})]
    emit("## Seconds per training round", "",
         f"Median wall seconds of rounds 2-{args.rounds - 1} of a {args.rounds}-round run (round 1 warms up, "
         f"the last evaluates), from each run's timing.csv; threads: the config's.", "",
         "| workload | data | sim, cuda | batched, cuda | batched over sim | sim, cuda, compiled "
         "| sim, cuda, CUDA graphs | sim, cpu |", "|---|---|---:|---:|---:|---:|---:|---:|")

    def timed(config: str, root: Path, **sets) -> str | float:
        try:
            return round_seconds(config, root, args.rounds, **sets)
        except Exception as err:  # one failing cell must not cost the rest of a one-shot check
            return f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}"

    def fmt(v: str | float | None) -> str:
        return "-" if v is None else v if isinstance(v, str) else f"{v:.3f}"

    for name, config, root, note, sets in rows:
        cpu = timed(config, root, device="cpu", **sets) if "FedAli" not in name else None
        sim = timed(config, root, device="cuda", **sets) if CUDA else None
        bat = timed(config, root, device="cuda", engine="batched", **sets) if CUDA else None
        compiled = timed(config, root, device="cuda", compile=True, **sets) if CUDA else None
        graphs = timed(config, root, device="cuda", compile="reduce-overhead", **sets) if CUDA else None
        ratio = f"{sim / bat:.2f}x" if isinstance(sim, float) and isinstance(bat, float) else "-"
        emit(f"| {name} | {note or root.name} | {fmt(sim)} | {fmt(bat)} | {ratio} | {fmt(compiled)} | {fmt(graphs)} "
             f"| {fmt(cpu)} |")
    if CUDA:
        cmd = [sys.executable, "benchmarks/batched_crossover.py", "--device", "cuda"]
        table = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        emit("", "## When training clients together pays on this GPU", "", f"`{' '.join(cmd[1:])}`:", "",
             table.stdout.strip() or table.stderr.strip()[-2000:])
        n, per = most_clients_together()
        emit("", "## Clients trained together", "",
             f"Most clients trained together before the GPU's memory ran out (FedAvg's batched step, HARCNN on "
             f"512 x 6 windows, batch 32, doubling from 8, at most 4096 or 90 s): {n}, "
             f"{per * 1000:.2f} ms per client-epoch of 64 windows there.")
        try:
            sl = table_slice(usc, args.slice_rounds, out)
            whole = sl["together"] / args.slice_rounds * 300 / 60
            emit("", "## A slice of ProtoHAR's Table II", "",
                 f"`protohar:table2` on {usc_note or usc.name}: {sl['runs']} runs (every method x seeds 0-2), "
                 f"{args.slice_rounds} rounds each, cuda, engine: batched. One after another: {sl['local']:.0f} s; "
                 f"as one population (`--executor together`): {sl['together']:.0f} s "
                 f"({sl['local'] / sl['together']:.2f}x). The whole table (300 rounds) at the population's pace: "
                 f"~{whole:.0f} min (setup and evaluation counted in the slice, so an upper bound per round).")
        except Exception as err:  # one failing section must not cost the record of the others
            emit("", "## A slice of ProtoHAR's Table II", "", f"failed: {type(err).__name__}: {str(err)[:200]}")
    print(f"\nwritten to {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
