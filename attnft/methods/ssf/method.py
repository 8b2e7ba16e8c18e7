"""SSF (Lian et al., NeurIPS 2022, "Scaling & Shifting Your Features") as the registered family ``ssf``: a learned
scale and shift per channel after every op of the base (:mod:`.layers`), the head trained whole; merged into the
layers before them at export, so an SSF adapter exports to a plain checkpoint with the same logits."""
from __future__ import annotations

from typing import Optional

from torch import nn

from ..added import AddedMethod
from ..defaults import TrainingDefaults
from . import layers


class SsfMethod(AddedMethod):
    name = "ssf"
    format_name = "ssf"
    specs = "ssf"
    prefixes = (layers.PREFIX,)
    options_cls = layers.Options
    layers = layers
    # the authors' VTAB scripts (dongzelian/SSF train_scripts): AdamW, 5e-3 to 1e-2 at batch 32, 10 warmup epochs
    training_defaults = TrainingDefaults(1e-2, "SSF's own VTAB rate (5e-3 at batch 32, AdamW), at batch 64")

    def merge(self, model: nn.Module) -> nn.Module:
        layers.merge(model)
        return model

    def export_refusal(self, name: str) -> Optional[str]:
        return None  # merged into the layers before it
