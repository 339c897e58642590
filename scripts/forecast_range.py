"""Range and correlation of a forecasting run's predictions, per client, at its checkpoint's round.

Usage (from the repository root, with fedwear installed)::

    python scripts/forecast_range.py results/runs/pcfedh-ppg_dalia/fedpcl-s0 ../shared/data/ppg_dalia_hr s6 s10

Restores the run as ``fedwear report`` does and prints, for each client named, the MSE of its test
windows, the range of its predicted and true heart rate (bpm) and their correlation. The FedPCL
finding of ``pcfedh:table2-ppg_dalia`` cites these numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fedwear.report.embeddings import restore
from fedwear.report.forecast import client_forecast
from fedwear.report.rundir import load_run


def main(run_dir: str, root: str, clients: list[str]) -> None:
    restored = restore(load_run(Path(run_dir)), Path(root))
    for cid in clients:
        fc = client_forecast(restored, cid)
        t, p = fc.true_bpm, fc.pred_bpm
        print(f"{cid}: MSE {np.mean((t - p) ** 2):.2f}, predicted {p.min():.1f}-{p.max():.1f} bpm, "
              f"true {t.min():.1f}-{t.max():.1f} bpm, correlation {np.corrcoef(t, p)[0, 1]:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
