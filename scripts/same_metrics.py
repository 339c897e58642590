"""Whether runs evaluated the same numbers, bit for bit, over the rounds they all evaluated.

Usage (from the repository root)::

    python scripts/same_metrics.py results/runs/pcfedh-ppg_dalia/pcfedh-r1-s0 \\
        results/runs/pcfedh-ppg_dalia/pcfedh-r1-no_pcl-s0

Compares every run's metrics.csv with the first one's on the rows of the rounds all of them
evaluated, and prints one line per run: identical, or the first round that differs. The notes of
``pcfedh:table3`` cite it (w/o PCL with one clustering round is PCFedH).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from fedwear import files
from fedwear.rundir import read_table


def metrics(run: Path) -> pd.DataFrame:
    path = run / files.METRICS
    if not path.is_file():
        raise SystemExit(f"error: {run}: no metrics.csv (not a run folder, or no evaluation yet)")
    return read_table(path)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    runs = [Path(a) for a in argv]
    frames = [metrics(r) for r in runs]
    common = sorted(set.intersection(*(set(f["round"]) for f in frames)))
    if not common:
        raise SystemExit("error: the runs have no evaluated round in common")
    first = frames[0][frames[0]["round"].isin(common)].reset_index(drop=True)
    for run, frame in zip(runs[1:], frames[1:], strict=True):
        rows = frame[frame["round"].isin(common)].reset_index(drop=True)
        if rows.equals(first):
            print(f"{run}: identical to {runs[0]} over rounds {common[0]}-{common[-1]} ({len(common)} evaluations)")
            continue
        differ = next((r for r in common if not rows[rows["round"] == r].reset_index(drop=True)
                       .equals(first[first["round"] == r].reset_index(drop=True))), None)
        print(f"{run}: differs from {runs[0]} from round {differ}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
