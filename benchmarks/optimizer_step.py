"""One optimiser step, torch's per-parameter loop against its fused kernel, on fedwear's models.

    python benchmarks/optimizer_step.py [--repeats 50]

``methods/training.make_optimizer`` builds Adam and AdamW with ``fused=True``. This measures why:
one thread, CPU time of ``optimizer.step()`` alone (random gradients), median over ``--repeats``
steps, for each model the FedAli, Meta-HAR/FedMAT and PCFedH tables train, in one process side by
side. It also prints the largest difference between the two updates after 20 steps (float
rounding only).
"""

from __future__ import annotations

import argparse
import time

import torch

from fedwear.models import hart
from fedwear.models.deepsense import DeepSense
from fedwear.models.fedmat import FedMAT
from fedwear.models.lstm import LSTMNet

MODELS = {
    "hart (FedAli, 128 x 6, Q 6)": lambda: hart.HART(128, 6, 6),
    "fedmat (150 x 6, Q 6)": lambda: FedMAT(150, 6, 6),
    "deepsense (Meta-HAR, 150 x 6, Q 6)": lambda: DeepSense(150, 6, 6),
    "lstm (PCFedH, 150 x 1)": lambda: LSTMNet(150, 1, 1),
}


def median_step_ms(opt: torch.optim.Optimizer, repeats: int) -> float:
    opt.step()
    times = []
    for _ in range(repeats):
        t = time.process_time()
        opt.step()
        times.append(time.process_time() - t)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, one thread, CPU ms per step (median of {args.repeats})")
    print(f"{'model':38s} {'tensors':>7s} {'params':>9s} {'opt':>5s} {'loop':>7s} {'fused':>7s} {'loop/fused':>10s} {'max diff':>9s}")
    for label, make in MODELS.items():
        torch.manual_seed(0)
        model = make()
        params = list(model.parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        for name, cls in (("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)):
            loop = median_step_ms(cls(params, lr=1e-3, fused=False, foreach=False), args.repeats)
            fused = median_step_ms(cls(params, lr=1e-3, fused=True), args.repeats)
            a, b = ([p.detach().clone().requires_grad_() for p in params] for _ in range(2))
            for x, y in zip(a, b, strict=True):
                x.grad = y.grad = torch.randn_like(x)
            oa, ob = cls(a, lr=1e-3, fused=False, foreach=False), cls(b, lr=1e-3, fused=True)
            for _ in range(20):
                oa.step()
                ob.step()
            diff = max(float((x - y).detach().abs().max()) for x, y in zip(a, b, strict=True))
            print(f"{label:38s} {len(params):7d} {sum(p.numel() for p in params):9d} {name:>5s} {loop:7.2f} "
                  f"{fused:7.2f} {loop / fused:10.2f} {diff:9.1e}")


if __name__ == "__main__":
    main()
