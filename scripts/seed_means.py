"""Means of several methods' final accuracies over the same seeds, from their run folders.

Usage (from the repository root)::

    python scripts/seed_means.py results/runs/metahar-table1-uci_hapt --seeds 0,1,2,3 \\
        centralized fedreptile@k3 metahar@n3 metahar-ce@n3

Each ``method[@budget]`` reads ``<folder>/<method>-s<seed>/summary.json``, key ``final``, and
prints the mean accuracy in % of the meta-train users (``personalized[@budget]``) and the
meta-test users (``new_clients[@budget]``) over exactly the seeds given, so that rows of a table
run at different seeds can be compared on the seeds they share.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean

from fedwear import files


def final_accuracy(run: Path, view: str) -> float:
    path = run / files.SUMMARY
    if not path.is_file():
        raise SystemExit(f"error: {path}: missing (run not finished; pass only seeds it has run)")
    final = json.loads(path.read_text())["final"]
    if view not in final:
        raise SystemExit(f"error: {path}: no '{view}' in 'final' (views: {', '.join(final)})")
    return 100 * final[view]["accuracy"]


def seed_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a comma-separated list of seeds, e.g. 0,1,2,3"
        ) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("methods", nargs="+", help="method[@budget], e.g. metahar@n3")
    parser.add_argument(
        "--seeds", required=True, type=seed_list, help="comma-separated, e.g. 0,1,2,3"
    )
    args = parser.parse_args()
    for spec in args.methods:
        method, _, budget = spec.partition("@")
        suffix = f"@{budget}" if budget else ""
        cells = [
            mean(final_accuracy(args.folder / f"{method}-s{s}", view + suffix) for s in args.seeds)
            for view in ("personalized", "new_clients")
        ]
        print(
            f"{spec}: meta-train {cells[0]:.2f}, meta-test {cells[1]:.2f} (seeds {','.join(map(str, args.seeds))})"
        )


if __name__ == "__main__":
    main()
