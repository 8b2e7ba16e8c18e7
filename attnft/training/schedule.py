"""The learning-rate schedule: linear warmup, then cosine, counted in optimizer steps."""
from __future__ import annotations

import math

import torch


def warmup_cosine_schedule(optimizer, warmup_steps: int, total_steps: int, min_ratio: float):
    """Linear warmup to the peak over ``warmup_steps``, then cosine to ``min_ratio`` x peak at ``total_steps``;
    a group's ``lr_scale`` (layer decay, as timm's schedulers read it) scales all of its curve."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    scales = [group.get("lr_scale", 1.0) for group in optimizer.param_groups]  # x 1.0 is exact: no scale, no change
    return torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda step, s=s: s * factor(step) for s in scales])
