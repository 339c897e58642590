"""PCFedH's cluster-representation encoder: a TS2Vec-style dilated convolution encoder.

pcfedh/pcfedh ``models.py`` (PCFedH's code: ``TSEncoder(input_dims=1, output_dims=10, hidden_dims=16,
depth=1, mask_mode='binomial')``; TS2Vec, Yue et al., AAAI 2022, Section 3):

1. NaN inputs set to 0, then a per-time-step ``Linear(input, hidden)``.
2. Timestamp masking on that latent: in training each (sample, step) is kept with probability
   0.5 and zeroed otherwise (``mask="binomial"``); ``mask="all_true"`` (or eval mode) keeps all.
3. ``depth + 1`` residual blocks ``x + conv2(GELU(conv1(GELU(x))))`` of kernel 3 and dilation
   ``2**i``, "same" padding; channels ``[hidden] * depth + [output]``; the last block projects
   its residual with a 1x1 convolution when the width changes.
4. ``Dropout(0.1)``; the output is ``[B, T, output]``, one representation per time step.

``instance_representation`` max-pools over time and L2-normalises: what PCFedH clusters.
The paper describes 10 residual blocks (TS2Vec's default); the code runs ``depth=1`` (two blocks,
hidden 16, output 10), the default here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _DilatedBlock(nn.Module):
    def __init__(self, cin: int, cout: int, dilation: int, project: bool) -> None:
        super().__init__()
        pad = ((3 - 1) * dilation + 1) // 2  # TS2Vec's "same" padding for kernel 3
        self.conv1 = nn.Conv1d(cin, cout, 3, padding=pad, dilation=dilation)
        self.conv2 = nn.Conv1d(cout, cout, 3, padding=pad, dilation=dilation)
        self.residual = nn.Conv1d(cin, cout, 1) if project or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        res = x if self.residual is None else self.residual(x)
        return res + self.conv2(F.gelu(self.conv1(F.gelu(x))))


class TSEncoder(nn.Module):
    """``[B, T, input] -> [B, T, output]`` (defaults: PCFedH's code, ``models.py``)."""

    def __init__(self, input_dims: int = 1, output_dims: int = 10, hidden_dims: int = 16, depth: int = 1,
                 mask: str = "binomial", keep_probability: float = 0.5, dropout: float = 0.1) -> None:
        super().__init__()
        if mask not in ("binomial", "all_true"):
            raise ValueError(f"mask must be 'binomial' or 'all_true', not {mask!r}")
        self.mask, self.keep_probability = mask, keep_probability
        self.input_fc = nn.Linear(input_dims, hidden_dims)
        widths = [hidden_dims] * depth + [output_dims]
        cins = [hidden_dims] + widths[:-1]
        self.blocks = nn.Sequential(*(
            _DilatedBlock(cin, cout, 2**i, project=(i == len(widths) - 1 and cin != cout))
            for i, (cin, cout) in enumerate(zip(cins, widths, strict=True))))
        self.dropout = nn.Dropout(dropout)
        self.output_dims = output_dims

    def forward(self, x: torch.Tensor, mask: str | None = None) -> torch.Tensor:
        x = torch.nan_to_num(x, nan=0.0)
        h = self.input_fc(x)
        if (mask or self.mask) == "binomial" and self.training:
            keep = torch.rand(h.shape[:2], device=h.device) < self.keep_probability
            h = h * keep.unsqueeze(-1)
        # contiguous: GELU's backward on a transposed view takes ~7x as long (one thread)
        h = self.blocks(h.transpose(1, 2).contiguous())
        return self.dropout(h).transpose(1, 2)


def instance_representation(z: torch.Tensor) -> torch.Tensor:
    """``[B, T, D] -> [B, D]``: max over time, L2-normalised (PCFedH's clustering features)."""
    return F.normalize(z.amax(dim=1), dim=-1)
