"""The work around a training step that is not the model's: the optimiser step and the proximal term.

    python benchmarks/step_overheads.py [--repeats 50]

One thread, CPU time, medians over ``--repeats``, both sides in one process.

(a) ``methods/training.make_optimizer`` builds Adam and AdamW with ``fused=True``: ``optimizer.step()``
alone (random gradients), torch's per-parameter loop against the fused kernel, for each model the
FedAli, Meta-HAR/FedMAT and PCFedH tables train, with the largest difference between the two
updates after 20 steps (float rounding only).

(b) ``methods/proximal.proximal`` (FedProx, PCFedH, FedSoft): a whole training step of PCFedH's
LSTM(1 -> 10) predictor (batch 64 x 150, MSE, fused Adam) without a proximal term, with K = 4
cluster centres built tensor by tensor (sum over centres and parameter tensors of
``((p - c) ** 2).sum()``), and with ``proximal`` (one ``[K, P]`` pass).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from fedwear.methods.proximal import centres as stacked
from fedwear.methods.proximal import proximal
from fedwear.methods.training import make_optimizer
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


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return sorted(times)[len(times) // 2] * 1e3


def proximal_steps(repeats: int, k: int = 4) -> None:
    torch.manual_seed(0)
    model = LSTMNet(150, 1, 1)
    params = list(model.parameters())
    centres = [[p.detach() + 0.01 * torch.randn_like(p) for p in params] for _ in range(k)]
    u = np.full(k, 1.0 / k)
    x, y = torch.randn(64, 150, 1), torch.randn(64, 1)
    opt = make_optimizer(params, "adam", 1e-2, 0.0, 0.0)
    towards, weights = stacked(centres), torch.as_tensor(u, dtype=torch.float32)

    def flat_term() -> torch.Tensor:
        return proximal(params, towards, weights, 1e-3)

    def per_tensor() -> torch.Tensor:
        return 0.5e-3 * sum(float(u[j]) * sum(((p - c) ** 2).sum() for p, c in zip(params, centres[j], strict=True))
                            for j in range(k))

    def step(term) -> None:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        if term is not None:
            loss = loss + term()
        loss.backward()
        opt.step()

    sides = {"no proximal term": None, f"tensor by tensor (K = {k})": per_tensor, f"proximal (K = {k})": flat_term}
    times = {label: median_ms(lambda t=term: step(t), repeats) for label, term in sides.items()}
    base = times["no proximal term"]
    print(f"\n(b) LSTM(1 -> 10) training step, batch 64 x 150, fused Adam (CPU ms, median of {repeats})")
    for label, ms in times.items():
        print(f"  {label:28s} {ms:6.2f}   term: {ms - base:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, one thread")
    print(f"(a) optimiser step alone (CPU ms, median of {args.repeats})")
    print(f"{'model':38s} {'tensors':>7s} {'params':>9s} {'opt':>5s} {'loop':>7s} {'fused':>7s} {'loop/fused':>10s} {'max diff':>9s}")
    for label, make in MODELS.items():
        torch.manual_seed(0)
        model = make()
        params = list(model.parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        for name, cls in (("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)):
            loop = median_ms(cls(params, lr=1e-3, fused=False, foreach=False).step, args.repeats)
            fused = median_ms(cls(params, lr=1e-3, fused=True).step, args.repeats)
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
    proximal_steps(args.repeats)


if __name__ == "__main__":
    main()
