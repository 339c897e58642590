"""Accuracy of runs at every evaluated round, one column per view, from their ``metrics.csv``.

Usage (from the repository root, with fedwear installed)::

    python scripts/eval_rounds.py results/runs/fedmat-table-usc_had/fedmat-s0 \\
        --views new_clients@e2,new_clients@e4

Each cell is the accuracy in % over the test windows of all clients evaluated in that view at
that round (weighted by test windows, as the results tables' Eq. 6, by
``fedwear.summary.aggregate_metrics``), so a final-round cell can be read against the rounds
before it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedwear import files
from fedwear.rundir import read_table
from fedwear.summary import aggregate_metrics


def accuracy_by_round(run: Path, views: list[str]) -> dict[int, dict[str, float]]:
    path = run / files.METRICS
    if not path.is_file():
        raise SystemExit(f"error: {path}: missing (is {run} a run folder?)")
    agg = aggregate_metrics(read_table(path), weights="test")
    agg = agg[(agg["split"] == "test") & (agg["metric"] == "accuracy") & agg["view"].isin(views)]
    if agg.empty:
        raise SystemExit(f"error: {path}: no test rows for views {', '.join(views)}")
    table: dict[int, dict[str, float]] = {}
    for row in agg.itertuples():
        table.setdefault(int(row.round), {})[row.view] = 100 * row.weighted
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
