"""How much of a run's CPU its evaluations take, from the run folders' own timing.

    python benchmarks/eval_share.py results/runs/metahar-table1-usc_had results/runs/metahar-table1-uci_hapt

For each run folder (a folder holding ``timing.csv`` and ``metrics.csv``, or a folder of them):
the rounds with an evaluation are those with rows in ``metrics.csv``; a round's CPU
(``timing.csv``, the process's CPU over the round: training, aggregation and, in an evaluated
round, evaluation) in an evaluated round minus the median CPU of the run's rounds without one is
that evaluation's CPU. The share is the sum of those over the run's total CPU. Every number is
a ratio within one run, so the load a run ran under cancels as far as it was steady.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from fedwear import files


def run_dirs(paths: list[str]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        out += [p] if (p / files.TIMING).is_file() else sorted(d for d in p.iterdir() if (d / files.TIMING).is_file())
    return out


def share(run: Path) -> dict:
    with (run / files.TIMING).open(newline="") as f:
        cpu = {int(r["round"]): float(r["cpu_s"]) for r in csv.DictReader(f)}
    with (run / files.METRICS).open(newline="") as f:
        evaluated = {int(r["round"]) for r in csv.DictReader(f)} & set(cpu)
    plain = [c for r, c in cpu.items() if r not in evaluated]
    train = statistics.median(plain) if plain else 0.0
    evals = sum(max(cpu[r] - train, 0.0) for r in evaluated)
    total = sum(cpu.values())
    return {"run": f"{run.parent.name}/{run.name}", "rounds": len(cpu), "evaluations": len(evaluated),
            "train_round_s": train, "eval_s": evals, "total_s": total, "share": evals / total if total else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="run folders, or folders of run folders")
    args = ap.parse_args()
    print("| run | rounds | evaluations | CPU-s a training round (median) | evaluation CPU-s | run CPU-s | evaluation share |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for run in run_dirs(args.paths):
        s = share(run)
        print(f"| {s['run']} | {s['rounds']} | {s['evaluations']} | {s['train_round_s']:.1f} | {s['eval_s']:.0f} | "
              f"{s['total_s']:.0f} | {100 * s['share']:.0f}% |")


if __name__ == "__main__":
    main()
