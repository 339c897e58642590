"""Wall time of a small engine=flower-sim run on a busy machine: Ray's worker niceness against 0.

    python benchmarks/flower_sim_under_load.py --repeats 2

Ray starts its worker processes (the actors that play the clients) at nice 15. While other
processes keep every core busy (here one busy loop per core, at nice 0: another run, another
test), those actors get a few per cent of a core. fedwear sets ``RAY_worker_niceness=0`` unless
the environment sets it; this runs the same synthetic 3-round run both ways, alternating, each in
its own process, under the same load, and prints the median wall times and their ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time

RUN = """
import sys
import fedwear
from fedwear.config import load_config
cfg = load_config(data={
    "method": "fedavg", "rounds": 3, "clients_per_round": 3, "local_epochs": 3, "batch_size": 8,
    "seed": 0, "threads": 1, "engine": "flower-sim",
    "dataset": {"name": "synthetic", "window": 32, "held_out": 2, "cache_dir": None,
                "synthetic": {"num_subjects": 8, "num_classes": 3, "seconds_per_class": 8}},
    "model": {"name": "cnn", "options": {"width": 8}}, "optimizer": {"lr": 0.05},
    "evaluation": {"adapt_epochs": 1}})
fedwear.run(cfg, sys.argv[1])
"""


def _spin() -> None:
    while True:
        pass


def timed_run(niceness: str, out: str) -> float:
    env = {**os.environ, "RAY_worker_niceness": niceness}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", RUN, out], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy-loop processes (default: one per core)")
    args = ap.parse_args()
    load = [mp.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in load:
        p.start()
    times: dict[str, list[float]] = {"15 (Ray's default)": [], "0 (fedwear's default)": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(args.repeats):
                for label in times:
                    times[label].append(timed_run(label.split()[0], f"{tmp}/{rep}-{label.split()[0]}"))
    finally:
        for p in load:
            p.terminate()
    print(f"{args.busy} busy-loop processes, {args.repeats} runs each\n")
    print("| worker niceness | median wall s | runs |\n|---|---:|---|")
    for label, ts in times.items():
        print(f"| {label} | {statistics.median(ts):.1f} | {', '.join(f'{t:.1f}' for t in ts)} |")
    slow, fast = (statistics.median(ts) for ts in times.values())
    print(f"\nnice 15 / nice 0: {slow / fast:.1f}x")


if __name__ == "__main__":
    main()
