"""Per-class scores of a finished classification run, at the round of its checkpoint.

Usage (from the repository root, with fedwear installed)::

    python scripts/per_class_scores.py results/runs/protohar-table2-uci_hapt/protohar-s0 \\
        --root ../shared/data/uci_hapt

Each training client is evaluated with the predictor the run's personalized view used at the
checkpoint's round (:func:`fedwear.report.embeddings.client_predictor`). Printed: each client's
test and train windows per class with its accuracy and macro-F1 (the per-client numbers the
results tables average), then sklearn's per-class report over all clients' test windows pooled.
The two macro-F1s differ in what they average: the tables' per-client macro-F1 counts a class a
client has one test window of as much as one it has nine of.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import classification_report

from fedwear.engines.client import forward
from fedwear.errors import FedwearError
from fedwear.evaluation.metrics import macro_f1
from fedwear.report.embeddings import class_names, client_predictor, restore_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder with its checkpoint.npz")
    parser.add_argument("--root", type=Path, help="the dataset folder, if not the run's dataset.root")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        restored = restore_run(args.run, args.root)
    except FedwearError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = class_names(restored.cfg, restored.data)
    q = len(names)
    bs = restored.cfg.evaluation.batch_size
    print(f"{args.run} at round {restored.checkpoint['round']}; classes: {', '.join(names)}")
    print(f"{'client':<8} {'test windows per class':<{4 * q}} {'train windows per class':<{4 * q}} acc    macro-F1")
    ys, preds = [], []
    for c in restored.data.clients:
        predictor = client_predictor(restored.method, restored.checkpoint, c, restored.cfg)
        pred = forward(predictor, c.test.x, bs).argmax(1).numpy()
        ys.append(c.test.y)
        preds.append(pred)
        counts = (" ".join(f"{n:3d}" for n in np.bincount(y, minlength=q)) for y in (c.test.y, c.train.y))
        print(f"{c.client_id:<8} {next(counts):<{4 * q}} {next(counts):<{4 * q}} "
              f"{np.mean(pred == c.test.y):.3f}  {macro_f1(c.test.y, pred):.3f}")
    y, pred = np.concatenate(ys), np.concatenate(preds)
    print("\nall clients' test windows pooled:")
    print(classification_report(y, pred, labels=list(range(q)), target_names=names, digits=3,
                                zero_division=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
