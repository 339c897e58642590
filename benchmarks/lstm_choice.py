"""``nn.LSTM`` or a hand-written cell loop for the ``lstm`` model: one client, and under vmap.

    python benchmarks/lstm_choice.py

One thread. (a) One client's training step (batch 64, 150 x 1 windows, hidden 10, Adam) and
forward pass with ``fedwear.models.build_model("lstm", ...)`` (``nn.LSTM``) and with a module
computing the same function step by step in Python (input projection for all steps in one
matmul, then per step one matmul and the gates). (b) ``torch.func.vmap(torch.func.grad(loss))``
over K clients' stacked weights (``functional_call``), the way a client-batched engine would
train them together. (c) torch's element-wise rates for the LSTM's gate functions, which
bound any LSTM implementation built from torch operators. (d) K clients as one ``nn.LSTM``
with block-diagonal weights (input K, hidden K x 10: one oneDNN call for all, the off-block
weights' gradients to be masked), and (e) K clients through an LSTM written with a hand-made
backward pass (:class:`StackedLSTM`: per time step one batched matmul and a few element-wise
ops on ``[K, 4 x hidden, batch]`` tensors, tanh as 2 sigmoid(2z) - 1), each checked against K
separate ``nn.LSTM``s before timing. Timings are medians of interleaved repeats (CPU seconds).
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


class StackedLSTM(torch.autograd.Function):
    """K one-layer LSTMs at once, output = last hidden state: ``x [K, B, T, C]`` and each
    client's ``nn.LSTM`` weights stacked on a first axis -> ``[K, B, H]``. Internally features
    first (``[K, 4H, B]``) so that a gate is a contiguous slice; the gradient is written out."""

    @staticmethod
    def forward(ctx, x, w_ih, w_hh, b_ih, b_hh):
        k, b, t_len, c = x.shape
        h = w_hh.shape[2]
        scale = x.new_ones(1, 4 * h, 1)
        scale[:, 2 * h:3 * h] = 2.0  # tanh(z) = 2 sigmoid(2z) - 1: one sigmoid for all gates
        xs = x.permute(0, 3, 2, 1).reshape(k, c, t_len * b)
        acts = torch.baddbmm((b_ih + b_hh).unsqueeze(2) * scale, w_ih * scale, xs)
        acts = acts.view(k, 4 * h, t_len, b).permute(2, 0, 1, 3).contiguous()  # [T, K, 4H, B]
        wh = w_hh * scale
        cs, hs, tcs = x.new_zeros(t_len + 1, k, h, b), x.new_zeros(t_len + 1, k, h, b), x.new_empty(t_len, k, h, b)
        for t in range(t_len):
            a = acts[t]
            a.baddbmm_(wh, hs[t]).sigmoid_()
            a[:, 2 * h:3 * h].mul_(2).sub_(1)
            cc = torch.mul(a[:, h:2 * h], cs[t], out=cs[t + 1]).addcmul_(a[:, :h], a[:, 2 * h:3 * h])
            tc = torch.mul(cc, 2, out=tcs[t]).sigmoid_().mul_(2).sub_(1)
            torch.mul(a[:, 3 * h:], tc, out=hs[t + 1])
        dact = acts - acts * acts
        dact[:, :, 2 * h:3 * h] = 1 - acts[:, :, 2 * h:3 * h] ** 2
        ctx.save_for_backward(x, w_hh, acts, dact, cs, hs, tcs)
        return hs[t_len].transpose(1, 2).contiguous()

    @staticmethod
    def backward(ctx, dh_out):
        x, w_hh, acts, dact, cs, hs, tcs = ctx.saved_tensors
        t_len, k, g4, b = acts.shape
        h, c = g4 // 4, x.shape[3]
        whT = w_hh.transpose(1, 2).contiguous()
        dpre = torch.empty_like(acts)
        dh = dh_out.transpose(1, 2).contiguous()
        dc = torch.zeros_like(dh)
        for t in range(t_len - 1, -1, -1):
            a, tc, d = acts[t], tcs[t], dpre[t]
            t1 = dh * a[:, 3 * h:]
            dc.add_(t1).addcmul_(t1 * tc, tc, value=-1)
            torch.mul(dc, a[:, 2 * h:3 * h], out=d[:, :h])
            torch.mul(dc, cs[t], out=d[:, h:2 * h])
            torch.mul(dc, a[:, :h], out=d[:, 2 * h:3 * h])
            torch.mul(dh, tc, out=d[:, 3 * h:])
            d.mul_(dact[t])
            dc.mul_(a[:, h:2 * h])
            dh = torch.bmm(whT, d)
        dp = dpre.permute(1, 2, 0, 3).reshape(k, g4, t_len * b)
        hprev = hs[:t_len].permute(1, 0, 3, 2).reshape(k, t_len * b, h)
        xk = x.permute(0, 2, 1, 3).reshape(k, t_len * b, c)
        db = dp.sum(2)
        return None, torch.bmm(dp, xk), torch.bmm(dp, hprev), db, db


def block_diagonal(lstms: list[nn.LSTM]) -> nn.LSTM:
    """One ``nn.LSTM`` computing K one-input LSTMs side by side (client k: input k, units k*H..)."""
    k, h = len(lstms), lstms[0].hidden_size
    big = nn.LSTM(k, k * h, batch_first=True)
    with torch.no_grad():
        for p in big.parameters():
            p.zero_()
        for j, m in enumerate(lstms):
            for q in range(4):
                rows = slice(q * k * h + j * h, q * k * h + (j + 1) * h)
                big.weight_ih_l0[rows, j] = m.weight_ih_l0[q * h:(q + 1) * h, 0]
                big.weight_hh_l0[rows, j * h:(j + 1) * h] = m.weight_hh_l0[q * h:(q + 1) * h]
                big.bias_ih_l0[rows] = m.bias_ih_l0[q * h:(q + 1) * h]
                big.bias_hh_l0[rows] = m.bias_hh_l0[q * h:(q + 1) * h]
    return big


def stacked(lstms: list[nn.LSTM]) -> list[torch.Tensor]:
    names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    return [torch.stack([getattr(m, n).detach() for m in lstms]).requires_grad_() for n in names]


def stacked_sides(clients: int) -> dict[str, list[float]]:
    """CPU ms per client of K separate ``nn.LSTM``s, one block-diagonal one, and :class:`StackedLSTM`."""
    lstms = [nn.LSTM(1, HIDDEN, batch_first=True) for _ in range(clients)]
    xs = torch.randn(clients, B, T, 1)
    ref = torch.stack([m(xs[j])[0][:, -1] for j, m in enumerate(lstms)]).detach()
    big, weights = block_diagonal(lstms), stacked(lstms)
    side = xs[..., 0].permute(1, 2, 0).contiguous()  # [B, T, K]: client k is input k
    got_d = big(side)[0][:, -1].view(B, clients, HIDDEN).transpose(0, 1)
    assert torch.allclose(got_d, ref, atol=1e-5) and torch.allclose(StackedLSTM.apply(xs, *weights), ref, atol=1e-5)
    sides = {
        "separate nn.LSTM": lambda: sum(m(xs[j])[0][:, -1].sum() for j, m in enumerate(lstms)).backward(),
        "block-diagonal": lambda: big(side)[0][:, -1].sum().backward(),
        "hand-written": lambda: StackedLSTM.apply(xs, *weights).sum().backward(),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(5):
        for name, fn in sides.items():
            times[name].append(cpu_ms(fn, 4) / clients)
    return times


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

    print("(d, e) K clients' LSTM(1 -> 10) forward + backward, batch 64 x 150 (CPU ms per client, median of 5 x 4)")
    for clients in (1, 4, 8, 16):
        times = stacked_sides(clients)
        print(f"  K={clients:2d}: " + "   ".join(f"{n} {statistics.median(v):6.2f}" for n, v in times.items()))

if __name__ == "__main__":
    main()
