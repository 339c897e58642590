"""How far a finished run's client models sit from its server's, and its soft-cluster weights.

Usage (from the repository root, with fedwear installed)::

    python scripts/client_drift.py results/runs/pcfedh-ppg_dalia/fedala-s0
    python scripts/client_drift.py results/runs/pcfedh-ppg_dalia/fedsoft-s0 results/runs/pcfedh-ppg_dalia/pcfedh-r1-s0

Reads each run folder's ``checkpoint.npz`` and prints, at the checkpoint's round: the largest
absolute difference between any client's model weight and the server's (for methods whose server
holds one model), the range of FedALA's ALA weights (``ala.*``), and each client's soft-cluster
weights ``u`` with its largest entry (FedSoft, PCFedH). The findings of
``pcfedh:table2-ppg_dalia`` (``fedwear.reproduce.tables.pcfedh.PCFEDH_PPG_FLAGGED``) cite these numbers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fedwear.callbacks import CHECKPOINT, load_checkpoint
from fedwear.errors import FedwearError


def describe(run: Path, ck: dict) -> None:
    server, clients = ck["server"].arrays, ck["clients"]
    print(f"{run} (round {ck['round']}, {len(clients)} clients)")
    shared = [k for k in server if all(k in c.arrays for c in clients.values())]
    if shared:
        drift = max(float(np.abs(c.arrays[k] - server[k]).max()) for c in clients.values() for k in shared)
        print(f"  largest |client weight - server weight|: {drift:.3g}")
    ala = [a for c in clients.values() for k, a in c.arrays.items() if k.startswith("ala.")]
    if ala:
        print(f"  ALA weights W: {min(a.min() for a in ala):.3f} to {max(a.max() for a in ala):.3f}")
    for cid in sorted(clients, key=lambda c: (len(c), c)):
        u = clients[cid].arrays.get("u")
        if u is not None:
            print(f"  {cid:>4} u = {np.array2string(np.asarray(u), precision=2, suppress_small=True)}"
                  f"  largest {u.max():.2f} (cluster {int(u.argmax())})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders holding a checkpoint.npz")
    runs = parser.parse_args().runs
    checkpoints = []
    for run in runs:
        if not (run / CHECKPOINT).is_file():
            parser.error(f"{run}: no {CHECKPOINT} there; pass a run folder of a run with checkpoints")
        try:
            checkpoints.append(load_checkpoint(run / CHECKPOINT))
        except FedwearError as e:
            parser.error(str(e))
    for run, ck in zip(runs, checkpoints, strict=True):
        describe(run, ck)


if __name__ == "__main__":
    main()
