"""HARCNN training steps on a fitted model, with subnormal floats kept and flushed to zero.

    python benchmarks/denormals.py --root ../shared/data/usc_had [--client s01] [--repeats 3]

ProtoHAR's USC-HAD protocol (the packaged ``protohar_usc_had.yaml``: HARCNN, SGD lr 1e-3,
momentum 0.9, batch 32, one torch thread) on one client's train windows: the model is first
fitted (Adam at ``--fit-lr``, faster there than the protocol's SGD) until an epoch's mean loss
falls under ``--target-loss`` (clients of late ``protohar:table2`` rounds reach ~1e-7) or for
``--max-epochs``: the regime in which the backward pass carries subnormal gradients. From that
state the same ``--epochs`` of training run with the flush off and on, in alternating order,
``--repeats`` times each. Printed: CPU-ms per step (medians), the ratio, the subnormal gradients
of one batch, and whether both sides end with the same weights bit for bit.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from importlib import resources

import numpy as np
import torch
import torch.nn.functional as F

from fedwear.config import load_config
from fedwear.data import load_federated
from fedwear.models import build_model


def epochs(model, opt, x, y, n_epochs: int, seed: int) -> float:
    """``n_epochs`` of shuffled mini-batches of 32; returns the last epoch's mean loss."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_epochs):
        losses = []
        for idx in torch.randperm(len(y), generator=g).split(32):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return float(np.mean(losses))


def subnormal_gradients(model, x, y) -> int:
    """Subnormal entries among the parameter gradients of one batch."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x[:32]), y[:32]).backward()
    tiny = torch.finfo(torch.float32).tiny
    return sum(int(((p.grad != 0) & (p.grad.abs() < tiny)).sum()) for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="the USC-HAD folder")
    ap.add_argument("--client", default=None, help="a client id (default: the first)")
    ap.add_argument("--target-loss", type=float, default=1e-7)
    ap.add_argument("--fit-lr", type=float, default=1e-3, help="Adam's learning rate while fitting")
    ap.add_argument("--max-epochs", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=5, help="timed epochs per side and repeat")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    torch.set_num_threads(1)
    config = resources.files("fedwear.reproduce.configs") / "protohar_usc_had.yaml"
    cfg = load_config(str(config), [f"dataset.root={args.root}"])
    data = load_federated(cfg.dataset, cfg.dataset.seed)
    client = next((c for c in data.clients if c.client_id == args.client), None) if args.client else data.clients[0]
    if client is None:
        raise SystemExit(f"--client {args.client}: not a client of this split ({', '.join(c.client_id for c in data.clients)})")
    x = torch.from_numpy(np.ascontiguousarray(client.train.x))
    y = torch.from_numpy(client.train.y)
    torch.manual_seed(0)
    model = build_model("harcnn", x.shape[1], x.shape[2], len(data.class_names))
    fit = torch.optim.Adam(model.parameters(), args.fit_lr)

    torch.set_flush_denormal(True)  # fitting is faster with it; the timed sides set their own
    fitted, loss = 0, float("inf")
    while loss > args.target_loss and fitted < args.max_epochs:
        loss = epochs(model, fit, x, y, 10, seed=fitted)
        fitted += 10
        print(f"fitting: epoch {fitted}, mean loss {loss:.2e}", file=sys.stderr, flush=True)
    opt = torch.optim.SGD(model.parameters(), cfg.optimizer.lr, momentum=cfg.optimizer.momentum)
    epochs(model, opt, x, y, 1, seed=fitted)  # the protocol's optimiser with its momentum built up
    start_model, start_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    torch.set_flush_denormal(False)
    subnormals = subnormal_gradients(model, x, y)

    steps = args.epochs * -(-len(y) // 32)
    ms: dict[bool, list[float]] = {False: [], True: []}
    final: dict[bool, dict[str, torch.Tensor]] = {}
    for r in range(args.repeats):
        for flush in ((False, True) if r % 2 == 0 else (True, False)):
            model.load_state_dict(start_model)
            opt.load_state_dict(copy.deepcopy(start_opt))
            torch.set_flush_denormal(flush)
            t = time.process_time()
            epochs(model, opt, x, y, args.epochs, seed=10_000)
            ms[flush].append(1e3 * (time.process_time() - t) / steps)
            final[flush] = copy.deepcopy(model.state_dict())
    torch.set_flush_denormal(False)
    same = all(torch.equal(final[False][k], final[True][k]) for k in final[False])

    print(f"client {client.client_id}: {len(y)} train windows; fitted for {fitted} epochs to a mean loss of {loss:.2e}; "
          f"{subnormals} subnormal parameter gradients in one batch of 32 (flush off)\n")
    print(f"| subnormals | CPU-ms per step (median of {args.repeats}) | runs |")
    print("|---|---:|---|")
    for flush, name in ((False, "kept (IEEE default)"), (True, "flushed to zero (fedwear)")):
        print(f"| {name} | {statistics.median(ms[flush]):.1f} | {', '.join(f'{v:.1f}' for v in ms[flush])} |")
    ratio = statistics.median(ms[True]) / statistics.median(ms[False])
    print(f"\nflushed / kept CPU per step: {ratio:.2f}; weights after {args.epochs} epochs from the fitted state: "
          f"{'bit-identical' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
