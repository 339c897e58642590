"""Which cluster models of clustered runs (IFCA, FedCE, FedSoft, ...) ever trained, and whether two
runs evaluated the same numbers.

Usage (from the repository root, with fedwear installed)::

    python scripts/cluster_use.py ../shared/data/ppg_dalia_hr results/runs/pcfedh-ppg_dalia/ifca-s0 \\
        results/runs/pcfedh-ppg_dalia/fedce-s0

With ``--members``: which clients choose each cluster model at the checkpoint's round, as its
evaluation did (IFCA: ``choose``; FedCE: the membership vectors of ``memberships``).

For each run folder: the largest change of each server-side cluster model (``cluster<k>.*``) between
the method's initial server state and the run's checkpoint; a cluster at 0.0 never trained. With
two or more runs: whether their checkpoints hold the same cluster models and their metrics.csv the
same personalized test rows. The IFCA and FedCE notes of the ``pcfedh:table2-*`` tables cite it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from fedwear import files
from fedwear.errors import FedwearError
from fedwear.report.embeddings import Restored, restore_run
from fedwear.rundir import RunFolder
from fedwear.seeding import derive_seed


def restored(run: Path, root: str) -> Restored:
    """The run's config, checkpoint, method and data (as ``fedwear report`` rebuilds them)."""
    if not (run / "config.yaml").is_file():
        raise FedwearError(f"{run}: not a run folder (no config.yaml)")
    return restore_run(run, Path(root))


def members(r: Restored) -> dict[str, list[str]]:
    """Cluster (IFCA) or membership vector (FedCE) -> its clients at the checkpoint's round, as the
    run's evaluation there estimated them (IFCA: ``choose``; FedCE: ``memberships``, seeded as
    ``personalize`` was)."""
    method, server, rnd = r.method, r.checkpoint["server"], int(r.checkpoint["round"])
    out: dict[str, list[str]] = {}
    for c in r.data.clients:
        down = method.evaluation_message(server, c.client_id, rnd)
        if hasattr(method, "memberships"):
            u = method.memberships(down, c, derive_seed(r.cfg.seed, "personalize", rnd, c.client_id))
            key = "u = " + " ".join(f"{v:.1f}" for v in u)
        else:
            key = f"cluster{method.choose(down, c)}"
        out.setdefault(key, []).append(c.client_id)
    return dict(sorted(out.items()))


def cluster_moves(r: Restored) -> dict[int, float]:
    """Per cluster model: its largest weight change from the method's initial server state."""
    arrays = r.checkpoint["server"].arrays
    moves: dict[int, float] = {}
    for key, start in r.method.init_server().arrays.items():
        if m := re.match(r"cluster(\d+)\.", key):
            k = int(m.group(1))
            moves[k] = max(moves.get(k, 0.0), float(np.abs(arrays[key] - start).max()))
    return moves


def personalized_rows(run: Path) -> pd.DataFrame:
    m = RunFolder(run).table(files.METRICS)
    return m[(m["view"] == "personalized") & (m["split"] == "test")].reset_index(drop=True)


def main(root: str, runs: list[Path], show_members: bool) -> None:
    clusters = {}
    for run in runs:
        r = restored(run, root)
        moves = cluster_moves(r)
        clusters[run] = {k: v for k, v in r.checkpoint["server"].arrays.items() if k.startswith("cluster")}
        trained = [k for k, v in sorted(moves.items()) if v > 0]
        text = ", ".join(f"cluster{k} {v:.4g}" for k, v in sorted(moves.items()))
        print(f"{run.name} (checkpoint round {r.checkpoint['round']}): largest change from the initial "
              f"model: {text}; trained: {len(trained)} of {len(moves)}")
        if show_members:
            for key, ids in members(r).items():
                print(f"  {key}: {len(ids)} clients: {', '.join(ids)}")
    for other in runs[1:]:
        a, b = clusters[runs[0]], clusters[other]
        same_models = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        same_rows = personalized_rows(runs[0]).equals(personalized_rows(other))
        print(f"{runs[0].name} vs {other.name}: same cluster models: {same_models}; "
              f"same personalized test rows in metrics.csv: {same_rows}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--members"]
    if len(args) < 2:
        sys.exit("usage: python scripts/cluster_use.py [--members] DATA_ROOT RUN_DIR [RUN_DIR ...]")
    try:
        main(args[0], [Path(p) for p in args[1:]], "--members" in sys.argv)
    except FedwearError as e:
        sys.exit(f"error: {e}")
