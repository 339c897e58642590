"""Accuracy of runs at every evaluated round, one column per view, from their ``metrics.csv``.

Usage (from the repository root)::

    python scripts/eval_rounds.py results/runs/fedmat-table-usc_had/fedmat-s0 \\
        --views new_clients@e2,new_clients@e4

Each cell is the accuracy in % over the test windows of all clients evaluated in that view at
that round (weighted by test windows, as the results tables' Eq. 6), so a final-round cell can be
read against the rounds before it.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path


def accuracy_by_round(run: Path, views: list[str]) -> dict[int, dict[str, float]]:
    path = run / "metrics.csv"
    if not path.is_file():
        raise SystemExit(f"error: {path}: missing (is {run} a run folder?)")
    correct: dict[tuple[int, str], float] = defaultdict(float)
    windows: dict[tuple[int, str], int] = defaultdict(int)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["split"] != "test" or row["view"] not in views:
                continue
            key = (int(row["round"]), row["view"])
            correct[key] += float(row["accuracy"]) * int(row["n"])
            windows[key] += int(row["n"])
    if not windows:
        raise SystemExit(f"error: {path}: no test rows for views {', '.join(views)}")
    table: dict[int, dict[str, float]] = defaultdict(dict)
    for (round_, view), n in windows.items():
        table[round_][view] = 100 * correct[round_, view] / n
    return dict(sorted(table.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders")
    parser.add_argument("--views", required=True, help="comma-separated views of metrics.csv")
    args = parser.parse_args()
    views = args.views.split(",")
    for run in args.runs:
        print(f"{run}\n| round | {' | '.join(views)} |\n|---|{'---|' * len(views)}")
        for round_, cells in accuracy_by_round(run, views).items():
            values = " | ".join(f"{cells[v]:.2f}" if v in cells else "-" for v in views)
            print(f"| {round_} | {values} |")


if __name__ == "__main__":
    main()
