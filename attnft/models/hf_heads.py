"""How each transformers family's classifier reads its backbone's output, for multi-task batches.

:class:`attnft.models.hf_models.TimmInterface` splits a model's forward into ``forward_features`` (the
backbone's last hidden state) and ``forward_head`` (the classifier as the family applies it).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..core.errors import ConfigError
from .hf_config import vision_config

__all__ = ["backbone", "feature_width", "head_fn"]


def backbone(model: nn.Module) -> nn.Module:
    """The backbone, whose output has ``last_hidden_state``: ``base_model``, or CLIP's vision tower (CLIP's
    ``base_model_prefix`` names the two-tower model, which its image classifier does not hold)."""
    base = model.base_model
    return base if base is not model else model.vision_model


def feature_width(model: nn.Module) -> int:
    """Input width of a classifier the model was built without (num_labels=0)."""
    width = getattr(backbone(model), "num_features", None) or vision_config(model.config).hidden_size
    return 2 * width if model.config.model_type.startswith("dinov2") else width  # [cls | mean of patches]


# what each family's classifier does with the backbone's last hidden state
def _cls_token_head(model, features):
    return model.classifier(features[:, 0])


def _distilled_head(model, features):
    return (model.cls_classifier(features[:, 0]) + model.distillation_classifier(features[:, 1])) / 2


def _dinov2_head(model, features):
    first_patch = 1 + getattr(model.config, "num_register_tokens", 0)
    return model.classifier(torch.cat([features[:, 0], features[:, first_patch:].mean(dim=1)], dim=1))


def _pooler_head(model, features):  # BEiT: mean of patch tokens, normed, in its pooler
    return model.classifier(model.base_model.pooler(features))


def _swin_head(model, features):
    return model.classifier(torch.flatten(model.base_model.pooler(features.transpose(1, 2)), 1))


def _patch_mean_head(model, features):  # CLIP: mean of the patch tokens, no norm
    return model.classifier(features[:, 1:].mean(dim=1))


_HEADS: dict[str, Callable] = {
    "ViTForImageClassification": _cls_token_head,
    "DeiTForImageClassification": _cls_token_head,
    "DeiTForImageClassificationWithTeacher": _distilled_head,
    "Dinov2ForImageClassification": _dinov2_head,
    "Dinov2WithRegistersForImageClassification": _dinov2_head,
    "BeitForImageClassification": _pooler_head,
    "SwinForImageClassification": _swin_head,
    "Swinv2ForImageClassification": _swin_head,
    "CLIPForImageClassification": _patch_mean_head,
}


def head_fn(model: nn.Module) -> Callable:
    fn = _HEADS.get(type(model).__name__)
    if fn is None:
        raise ConfigError(f"{type(model).__name__}: attnft does not know how its classifier reads the backbone's "
                          f"output, so it cannot serve mixed-task batches (known: {', '.join(_HEADS)})")
    return fn
