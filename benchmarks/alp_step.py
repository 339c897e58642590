"""Where a HART-ALP training step spends its extra time over HART (FedAli's ALP layers).

    python benchmarks/alp_step.py [--repeats 15]

One thread, CPU time, medians over ``--repeats``, in one process: (a) a training step (batch 64
of 128 x 6 windows, cross-entropy, fused Adam) of HART and of HART-ALP, alternating; (b) per ALP
block in training mode, the cosine matrix of the tokens against both prototype sets, its
Sinkhorn plan, the two argmax passes (global match and local assignment), and the whole layer's
forward (those plus the EMA update, GLU and mixing).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from step_overheads import median_ms  # benchmarks/ is on sys.path when this file runs

from fedwear.methods.training import make_optimizer
from fedwear.models import alp, hart


def block_parts(layer: alp.ALP, tokens: torch.Tensor, repeats: int) -> list[float]:
    """ms of the cosines, the Sinkhorn plan, the two argmax passes and the layer's forward."""
    flat = tokens.reshape(-1, tokens.shape[-1])
    protos = torch.cat([layer.local_prototypes, layer.global_prototypes])
    g = layer.count
    cos = alp.l2_normalize(flat) @ alp.l2_normalize(protos).T
    plan = alp.sinkhorn(cos)
    return [median_ms(lambda: alp.l2_normalize(flat) @ alp.l2_normalize(protos).T, repeats),
            median_ms(lambda: alp.sinkhorn(cos), repeats),
            median_ms(lambda: (plan[:, -g:].argmax(1), plan[:, :g].argmax(1)), repeats),
            median_ms(lambda: layer(tokens.clone()), repeats)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(1)
    x, y = torch.randn(64, 128, 6), torch.randint(0, 6, (64,))
    models = {}
    for name, options in (("hart", None), ("hart-alp", {})):
        torch.manual_seed(0)
        model = hart.HART(128, 6, 6, liteformer="code", alp=options).train()
        models[name] = (model, make_optimizer(list(model.parameters()), "adam", 1e-4, 1e-7, 0.0))

    def step(name: str) -> None:
        model, opt = models[name]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    times = {name: [] for name in models}
    for name in models:
        step(name)  # warm-up
    for _ in range(args.repeats):  # alternating, so load hits both alike
        for name in models:
            t = time.process_time()
            step(name)
            times[name].append((time.process_time() - t) * 1e3)
    print("(a) training step, ms:", {k: round(sorted(v)[len(v) // 2], 1) for k, v in times.items()})

    layers = models["hart-alp"][0].alp_layers()
    tokens = []
    hooks = [layer.register_forward_hook(lambda m, i, o: tokens.append(i[0].detach())) for layer in layers.values()]
    models["hart-alp"][0](x)
    for h in hooks:
        h.remove()
    print("(b) per ALP block, ms: tokens x prototypes: cosines, sinkhorn, argmax x 2, whole forward")
    total = 0.0
    for (name, layer), t in zip(layers.items(), tokens, strict=True):
        parts = block_parts(layer, t, args.repeats)
        total += parts[-1]
        print(f"  {name}: {t.shape[0] * t.shape[1]} x {2 * layer.count}: " + ", ".join(f"{v:.2f}" for v in parts))
    print(f"  all blocks' forward: {total:.1f}")


if __name__ == "__main__":
    main()
