"""K clients' LSTM(1 -> 10) training step written in torch operators, eager vs ``torch.compile``.

    python benchmarks/lstm_compile.py [K]

One thread. K clients' weights stacked (``[K, ...]``); a step is the forward pass over batch
64 x 150 x 1 windows (input projection for all time steps at once, then per time step one
batched matmul and the gates, unrolled in Python), an MSE loss on the last hidden state's linear
output, and the backward pass. ``torch.compile`` (inductor, CPU: generated C++, so a C++
compiler must be present) traces the 150 unrolled steps into one graph and fuses the gates'
element-wise work. Printed: the first step's wall time (compilation) and the CPU time per
client-step of 10 steps after 3 warm-up steps, for each mode in its own process. Compare with
``nn.LSTM``'s ~10 ms per client-step in ``results/lstm_choice.txt`` (a, d).
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch

B, T, H = 64, 150, 10


def sequence(x, w_ih, w_hh, b, w_out, b_out):
    k = x.shape[0]
    gates_in = torch.einsum("kbti,kig->kbtg", x, w_ih) + b[:, None]
    h = x.new_zeros(k, B, H)
    c = x.new_zeros(k, B, H)
    for t in range(T):
        g = gates_in[:, :, t] + torch.bmm(h, w_hh)
        i, f, gg, o = g.chunk(4, 2)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
    return torch.bmm(h, w_out) + b_out


def measure(k: int, mode: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    params = [torch.randn(k, 1, 4 * H) * 0.3, torch.randn(k, H, 4 * H) * 0.3, torch.zeros(k, 1, 4 * H),
              torch.randn(k, H, 1) * 0.3, torch.zeros(k, 1, 1)]
    params = [p.requires_grad_() for p in params]
    x, y = torch.randn(k, B, T, 1), torch.randn(k, B, 1)
    fn = torch.compile(sequence, dynamic=False) if mode == "compile" else sequence

    def step() -> None:
        loss = ((fn(x, *params) - y) ** 2).mean()
        loss.backward()
        for p in params:
            p.grad = None

    t0 = time.time()
    step()
    first = time.time() - t0
    for _ in range(3):
        step()
    t = time.process_time()
    for _ in range(10):
        step()
    per = (time.process_time() - t) / 10 / k * 1000
    print(f"{mode:<8} K={k}: first step {first:7.1f} s wall, {per:6.1f} CPU-ms per client-step")


if __name__ == "__main__":
    if len(sys.argv) > 2:
        measure(int(sys.argv[1]), sys.argv[2])
    else:
        k = sys.argv[1] if len(sys.argv) > 1 else "12"
        for mode in ("eager", "compile"):
            subprocess.run([sys.executable, __file__, k, mode], check=True)
