"""Heart-rate levels of the raw files that the pcfedh:table2 findings and notes cite.

Usage (from the repository root)::

    python scripts/heart_rate_levels.py ../shared/data

Prints, for the distracted-driving data (drives 3-7, zero and missing readings left out), each
subject's mean and largest heart rate and the median subject's mean; and for Stress-Predict's
``Raw_data/S*/HR.csv`` (Empatica: start time and rate in the first two lines) the median and 99th
percentile of the change between consecutive values, over all files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd


def distracted_levels(root: Path) -> pd.DataFrame:
    rows = []
    for f in sorted(root.glob("T*.csv*")):
        d = pd.read_csv(f, usecols=["Drive", "Heart.Rate"])
        hr = pd.to_numeric(d.loc[d["Drive"].isin([3, 4, 5, 6, 7]), "Heart.Rate"], errors="coerce")
        hr = hr[hr > 0]
        if len(hr):
            rows.append({"subject": f.name.split(".")[0], "mean": hr.mean(), "max": hr.max()})
    return pd.DataFrame(rows).sort_values("mean")


def stress_changes(root: Path) -> np.ndarray:
    files = sorted(root.glob("S*/HR.csv*"))
    return np.concatenate([np.abs(np.diff(pd.read_csv(f, header=None)[0].to_numpy()[2:])) for f in files])


def main(data: Path) -> None:
    levels = distracted_levels(data / "distracted_driving")
    print(f"distracted driving, drives 3-7: {len(levels)} subjects, median subject mean "
          f"{levels['mean'].median():.0f} bpm; the highest:")
    print(levels.tail(4).round(0).to_string(index=False))
    d = stress_changes(data / "stress_predict" / "Raw_data")
    print(f"Stress-Predict HR.csv: |change| per second, median {np.median(d):.2f} bpm, "
          f"99th percentile {np.percentile(d, 99):.2f} bpm ({len(d)} changes)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data"))
