"""The one place that tells the libraries apart: a model's name, or a built model, to its :class:`ModelLibrary`.

:func:`create_model` builds any name attnft takes; :func:`library_for_name` and :func:`library_of` hand
out the library object that everything downstream asks (cards, exports, the patch grid) instead of
asking which library a model is from (:mod:`.library`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from torch import nn

from ..core.checks import check_type
from .hf_library import TRANSFORMERS
from .library import ModelLibrary
from .timm_library import TIMM

# the first that claims a name or a model is its library; timm, the last, claims every other one
LIBRARIES: tuple[ModelLibrary, ...] = (TRANSFORMERS, TIMM)

__all__ = ["LIBRARIES", "builds_from_code", "create_model", "library_for_name", "library_of", "patch_grid"]


def library_for_name(name: str) -> ModelLibrary:
    """The library that builds the model named ``name`` (as :func:`create_model` takes it)."""
    return next(library for library in LIBRARIES if library.claims_name(name))


def builds_from_code(name: str) -> bool:
    """Whether ``create_model(name, pretrained=False)`` needs the code alone: a timm architecture (with its tag), not a
    hub repo, a folder or a transformers checkpoint, whose configs are files to fetch or read."""
    return ":" not in name and library_for_name(name) is TIMM


def library_of(model: nn.Module) -> ModelLibrary:
    """The library that built ``model``."""
    return next(library for library in LIBRARIES if library.claims_model(model))


def create_model(
    name: str,
    *,
    pretrained: bool = True,
    checkpoint: str | Path | None = None,
    num_classes: int | None = None,
    img_size: int | None = None,
    drop_path_rate: float = 0.0,
    **kwargs: Any,
) -> nn.Module:
    """Build ``name`` at ``img_size`` pixels (square; None: the weights' size) with its weights.

    ``name``: a timm name (:mod:`.sources`) or a transformers one (:mod:`.hf_models`). Weights:
    ``checkpoint`` (a state dict file) if given, else the pretrained weights if ``pretrained``,
    else random. ``num_classes`` None keeps the classes of the weights; another number gets a new
    classifier. ``kwargs`` go to the model (timm: e.g. ``embed_dim``; transformers: config fields).
    Raises UnknownModelError, ConfigError, AdapterError or OfflineError with a one-line reason.
    """
    check_type(name, str, "name", "a model name (str), e.g. 'vit_small_patch16_224'")
    options = dict(kwargs, pretrained=pretrained, checkpoint=checkpoint, num_classes=num_classes, img_size=img_size,
                   drop_path_rate=drop_path_rate)
    return library_for_name(name).build(name, options)


def patch_grid(model: nn.Module) -> Optional[tuple[int, int]]:
    """The (H, W) token grid of the patch embedding, or None for models without one."""
    return library_of(model).patch_grid(model)
