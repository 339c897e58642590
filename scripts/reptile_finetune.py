"""FedReptile's fine-tuning of the meta-train users, varied from a finished run's checkpoint.

Usage (from the repository root, with fedwear installed)::

    python scripts/reptile_finetune.py results/runs/metahar-table1-usc_had/fedreptile-s0 \\
        --root ../shared/data/usc_had --epochs 20

From the checkpoint's server model (all of it: body and the global head) and each training user's
kept optimiser, prints the meta-train accuracy (test windows pooled over users, Eq. 6) after 1, 2,
3, ... cumulative epochs of cross-entropy fine-tuning, under four settings:

* ``as run``: the user's kept Adam at the learning rate its schedule has reached (the code's
  ``reptile.py`` ``adapt_train``; fedwear's ``FedReptile.tune``), batch-norm statistics updated;
* ``kept Adam, BN frozen``: the same steps with the batch-norm running statistics held (momentum
  0), so what the weight steps alone do;
* ``BN only``: forward passes in training mode, no step, so what re-estimating the batch-norm
  statistics on the user's windows alone does;
* ``fresh Adam 1e-3``: a new optimiser at the configured learning rate (what Meta-HAR's stage 2
  gets, and FedReptile's own meta-test users), scored after 1, 2, 3, 5, every 10th epoch and
  ``--epochs`` (Meta-HAR's n = 1-3 is 20-60 epochs: 10n of its pairwise loss, then 10n of CE).

Each line also gives the accuracy with the logits restricted to the user's own classes (the label
space of Meta-HAR's per-user head) and the share of the errors that name a class the user does not
have. The first line gives the learning rates the kept optimisers had reached. The checkpoint
holds the states after its round's evaluation, so ``as run`` is fine-tuned once more from what that
evaluation kept, not bit for bit the model metrics.csv scored. The FedReptile note of
``metahar:table1-usc_had`` (``fedwear.reproduce.tables.metahar``) cites these numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedwear.data.types import ClientData
from fedwear.errors import FedwearError
from fedwear.methods.api import Record
from fedwear.methods.fedavg import PARTS
from fedwear.methods.meta import own_classes
from fedwear.report.embeddings import restore_run
from fedwear.seeding import derive_seed

SETTINGS = ("as run", "kept Adam, BN frozen", "BN only", "fresh Adam 1e-3")


def scores(model: nn.Module, c: ClientData, classes: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Correct (global head), correct (own classes only), errors naming an absent class, windows."""
    model.eval()
    with torch.no_grad():
        logits = model(torch.as_tensor(c.test.x))
    pred = logits.argmax(1).numpy()
    mask = torch.full((logits.shape[1],), float("-inf"))
    mask[list(classes)] = 0.0
    own = (logits + mask).argmax(1).numpy()
    y = c.test.y
    wrong = pred != y
    return int((~wrong).sum()), int((own == y).sum()), int((wrong & ~np.isin(pred, classes)).sum()), len(y)


def batch_norms(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [mod for mod in model.modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a FedReptile run folder with its checkpoint.npz")
    parser.add_argument("--root", type=Path, help="the dataset folder, if not the run's dataset.root")
    parser.add_argument("--epochs", type=int, default=20, help="largest budget of the fresh optimiser")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        restored = restore_run(args.run, args.root)
    except FedwearError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m, ck, cfg = restored.method, restored.checkpoint, restored.cfg
    rnd = ck["round"]
    budgets = {s: [1, 2, 3] for s in SETTINGS}
    budgets["fresh Adam 1e-3"] = sorted({1, 2, 3, 5, *range(10, args.epochs, 10), args.epochs})
    totals = {(s, k): np.zeros(4, np.int64) for s in SETTINGS for k in budgets[s]}
    lrs = []
    momenta = [bn.momentum for bn in batch_norms(m.model)]
    for c in restored.data.clients:
        down = m.evaluation_message(ck["server"], c.client_id, rnd)
        state = ck["clients"].get(c.client_id, Record())
        classes = own_classes(m.task.client_classes, c.client_id, c.train.y)
        seed = derive_seed(cfg.seed, "personalize", rnd, c.client_id)
        for s in SETTINGS:
            model = m.load(down, Record())
            opt = m.optimizer(model, PARTS, Record() if s == "fresh Adam 1e-3" else state, scheduled=False)
            if s == "as run":
                lrs.append(opt.optimizer.param_groups[0]["lr"])
            for bn, mom in zip(batch_norms(model), momenta, strict=True):
                bn.momentum = 0.0 if s == "kept Adam, BN frozen" else mom
            x = torch.as_tensor(c.train.x)
            for k in range(1, max(budgets[s]) + 1):
                if s == "BN only":
                    model.train()
                    with torch.no_grad():
                        for i in range(0, len(x) - m.batch_size + 1, m.batch_size):  # drop-last batches
                            model(x[i : i + m.batch_size])
                else:
                    m.train(model, opt, c, derive_seed(seed, "tune", k), epochs=1)
                if k in budgets[s]:
                    totals[s, k] += scores(model, c, classes)
    print(f"{args.run} at round {rnd}: {len(restored.data.clients)} meta-train users; kept optimisers' "
          f"learning rate {min(lrs):.2g} to {max(lrs):.2g} (median {np.median(lrs):.2g})")
    print(f"{'setting':<22} {'epochs':>6} {'accuracy':>8} {'own classes':>11} {'errors to absent classes':>24}")
    for (s, k), (ok, own, absent, n) in totals.items():
        errs = n - ok
        print(f"{s:<22} {k:>6} {100 * ok / n:8.2f} {100 * own / n:11.2f} "
              f"{f'{absent}/{errs}' if errs else '0/0':>24}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
