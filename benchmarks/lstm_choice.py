"""``nn.LSTM`` or a hand-written cell loop for the ``lstm`` model: one client, and under vmap.

    python benchmarks/lstm_choice.py

One thread. (a) One client's training step (batch 64, 150 x 1 windows, hidden 10, Adam) and
forward pass with ``fedwear.models.build_model("lstm", ...)`` (``nn.LSTM``) and with a module
computing the same function step by step in Python (input projection for all steps in one
matmul, then per step one matmul and the gates). (b) ``torch.func.vmap(torch.func.grad(loss))``
over K clients' stacked weights (``functional_call``), the way a client-batched engine would
train them together. (c) torch's element-wise rates for the LSTM's gate functions, which
bound any LSTM implementation built from torch operators. Timings are medians of interleaved
repeats (CPU seconds).
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from fedwear.models import build_model

B, T, HIDDEN, CLASSES = 64, 150, 10, 4


class CellLoop(nn.Module):
    """LSTM(1 -> HIDDEN) over time, written out step by step (gate order i, f, g, o, as nn.LSTM)."""

    def __init__(self) -> None:
        super().__init__()
        ref = nn.LSTM(1, HIDDEN, batch_first=True)
        self.w_ih, self.w_hh = nn.Parameter(ref.weight_ih_l0.detach()), nn.Parameter(ref.weight_hh_l0.detach())
        self.b = nn.Parameter((ref.bias_ih_l0 + ref.bias_hh_l0).detach())
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xw = F.linear(x, self.w_ih, self.b)
        h = c = x.new_zeros(x.shape[0], HIDDEN)
        for t in range(x.shape[1]):
            i, f, g, o = (xw[:, t] + F.linear(h, self.w_hh)).chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return self.head(h)


def cpu_ms(fn, n: int) -> float:
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) / n * 1000


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", message="There is a performance drop")
    x, y = torch.randn(B, T, 1), torch.randint(0, CLASSES, (B,))
    models = {"nn.LSTM": lambda: build_model("lstm", T, 1, CLASSES), "cell loop": CellLoop}
    step: dict[str, list[float]] = {k: [] for k in models}
    fwd: dict[str, list[float]] = {k: [] for k in models}
    built = {k: make() for k, make in models.items()}
    opts = {k: torch.optim.Adam(m.parameters(), 1e-2) for k, m in built.items()}

    def train_step(k: str) -> None:
        opts[k].zero_grad()
        F.cross_entropy(built[k](x), y).backward()
        opts[k].step()

    for k in models:
        for _ in range(3):
            train_step(k)
    for _ in range(5):
        for k in models:
            step[k].append(cpu_ms(lambda k=k: train_step(k), 10))
            with torch.no_grad():
                fwd[k].append(cpu_ms(lambda k=k: built[k](x), 10))
    print("(a) one client, batch 64 x 150 x 1, hidden 10 (CPU ms, median of 5 x 10)")
    for k in models:
        print(f"  {k:10s} training step {statistics.median(step[k]):6.1f}   forward {statistics.median(fwd[k]):6.1f}")

    print("(b) vmap(grad(loss)) over K clients' stacked weights (CPU ms per client, median of 3)")
    for k, make in models.items():
        for clients in (1, 8):
            params, buffers = stack_module_state([make() for _ in range(clients)])
            base = make()

            def loss(p, b, xx, yy, base=base):
                return F.cross_entropy(functional_call(base, (p, b), (xx,)), yy)

            f = vmap(grad(loss))
            xs, ys = x.expand(clients, *x.shape).contiguous(), y.expand(clients, B).contiguous()
            f(params, buffers, xs, ys)
            times = [cpu_ms(lambda f=f, p=params, b=buffers, xs=xs, ys=ys: f(p, b, xs, ys), 2) for _ in range(3)]
            print(f"  {k:10s} K={clients}: {statistics.median(times) / clients:7.1f}")

    print("(c) element-wise ops (CPU ns per element, median of 5 x 200 calls)")
    for n in (B * 4 * HIDDEN, 50 * B * 4 * HIDDEN):
        a = torch.randn(n)
        for name, op in (("sigmoid", torch.sigmoid), ("tanh", torch.tanh), ("mul", lambda t: t * t)):
            op(a)
            ns = statistics.median(cpu_ms(lambda op=op, a=a: op(a), 200) for _ in range(5)) * 1e6 / n
            print(f"  {name:8s} {n:7d} elements: {ns:5.2f}")


if __name__ == "__main__":
    main()
