"""Where a run's CPU went, from its run folder: total CPU seconds, the share of its evaluated
rounds, and the median CPU seconds of a round.

Usage (from the repository root)::

    python scripts/run_cpu.py results/runs/metahar-merged/metahar-s0 results/runs/protohar-table2/*

Reads each folder's ``timing.csv`` (``cpu_s`` per round) and ``config.yaml`` (``rounds`` and
``evaluation.every``: a round is evaluated every ``every`` rounds and at the last).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from fedwear.rundir import RunFolder


def run_cpu(folder: Path) -> dict[str, float]:
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    t = RunFolder(folder).timing()
    t = t[t["round"] > 0]
    every, last = cfg["evaluation"]["every"], cfg["rounds"]
    evaluated = t[(t["round"] % every == 0) | (t["round"] == last)]
    total = float(t["cpu_s"].sum())
    return {"rounds": len(t), "total_cpu_s": total, "hours": total / 3600,
            "evaluated_cpu_s": float(evaluated["cpu_s"].sum()),
            "evaluated_share": float(evaluated["cpu_s"].sum()) / total if total else float("nan"),
            "median_round_cpu_s": float(t["cpu_s"].median())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args()
    print("| run | rounds | CPU-s | hours | evaluated rounds' CPU-s | share | median CPU-s / round |")
    print("|---|---|---|---|---|---|---|")
    for folder in args.folders:
        c = run_cpu(folder)
        print(f"| {folder} | {c['rounds']} | {c['total_cpu_s']:.0f} | {c['hours']:.2f} | {c['evaluated_cpu_s']:.0f} | "
              f"{100 * c['evaluated_share']:.0f}% | {c['median_round_cpu_s']:.1f} |")


if __name__ == "__main__":
    main()
