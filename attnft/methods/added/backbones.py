"""Which models the families that add modules know besides timm's VisionTransformer: transformers' ViT and DeiT
image classifiers, found by their backbone (one place for the three families)."""
from __future__ import annotations

import sys
from typing import Optional

from torch import nn


def transformers_backbone(model: nn.Module) -> Optional[nn.Module]:
    """The ``ViTModel`` / ``DeiTModel`` of a transformers ViT or DeiT image classifier, else None."""
    if "transformers" not in sys.modules:  # a transformers model has imported it; a timm one need not wait for it
        return None
    from transformers import (
        DeiTForImageClassification,
        DeiTForImageClassificationWithTeacher,
        ViTForImageClassification,
    )

    if isinstance(model, ViTForImageClassification):
        return model.vit
    if isinstance(model, (DeiTForImageClassification, DeiTForImageClassificationWithTeacher)):
        return model.deit
    return None
