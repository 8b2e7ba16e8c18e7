"""Model EMA: timm's ``ModelEmaV3`` of what trains, the weights a run evaluates and saves.

The average is a copy of the whole model (a PeftModel for peft methods), made on the run's
device before FFN recompute, compilation and DDP touch the model, and updated after every
optimizer step from the unwrapped model (``step`` counts optimizer steps: timm's warmup reads
it). Only trainable tensors are averaged: the frozen ones stay bitwise the base's, so the saved
adapter still matches its base's fingerprint (a lerp of equal values is not always the value:
-0.0 comes out +0.0), and an ``attn`` run averages a third of the weights. Buffers are copied,
as timm does with ``exclude_buffers``. A checkpoint holds the averaged tensors, which is all a
resumed run needs to continue bitwise.
"""
from __future__ import annotations

from typing import Optional

import torch
from timm.utils import ModelEmaV3
from torch import nn

from .config import FinetuneConfig
from ..core.errors import ConfigError


class TrainedEma(ModelEmaV3):
    """timm's ModelEmaV3 whose update averages the trainable parameters only (see the module doc)."""

    @torch.no_grad()
    def apply_update_(self, model: nn.Module, decay: float) -> None:
        pairs = [(e, p) for e, p in zip(self.module.parameters(), model.parameters()) if p.requires_grad]
        # timm's lerp: its stochastic rounding for bfloat16 averages (the copy is on the model's device)
        self._foreach_lerp_([e for e, _ in pairs], [p for _, p in pairs], weight=1.0 - decay)
        for e, b in zip(self.module.buffers(), model.buffers()):
            e.copy_(b)

    def trained_state(self) -> dict[str, torch.Tensor]:
        """The averaged tensors, by name (CPU copies): what a checkpoint keeps."""
        return {n: p.detach().cpu() for n, p in self.module.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def load_trained_state(self, state: Optional[dict]) -> None:
        """Put back what :meth:`trained_state` gave; a checkpoint without it is one ConfigError line."""
        if state is None:
            raise ConfigError("the checkpoint holds no model EMA (made without --model-ema): resume without "
                              "--model-ema, or start over without --resume and with --overwrite")
        params = dict(self.module.named_parameters())
        for name, value in state.items():
            params[name].copy_(value)

    def describe(self, total_steps: int) -> str:
        """One line: the decay, its warmup, and a note when the average cannot move in this run."""
        warmup = ", warmup" if self.use_warmup else ""
        text = f"model EMA: decay {self.decay:g}{warmup}; evaluated and saved"
        horizon = 1 / (1 - self.decay)
        if not self.use_warmup and horizon > total_steps:
            text += (f" (it averages over about {horizon:,.0f} steps, the run has {total_steps:,}: it stays near "
                     "the start; --model-ema-warmup or a lower --model-ema-decay)")
        return text


def build_ema(cfg: FinetuneConfig, model: nn.Module, accelerator) -> Optional[TrainedEma]:
    """The run's EMA of ``model`` (moved to the device first), or None without ``--model-ema``.
    Prepared for evaluation: the run's precision, never DDP-wrapped (every process keeps its own)."""
    if not cfg.model_ema:
        return None
    model.to(accelerator.device)  # the copy and timm's rounding generator on the device
    ema = TrainedEma(model, decay=cfg.model_ema_decay, use_warmup=cfg.model_ema_warmup)
    accelerator.prepare_model(ema.module, evaluation_mode=True)
    return ema
