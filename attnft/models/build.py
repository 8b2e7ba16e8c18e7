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

    Weights: ``checkpoint`` (a state dict file) if given, else the pretrained weights if ``pretrained``,
    else random. Position embeddings and relative-position tables are resampled to ``img_size``.

    Args:
        name: a timm name, optionally with its tag (``vit_small_patch16_224.augreg_in1k``), ``hf-hub:ORG/REPO``,
            ``local-dir:PATH``, a bundled model (``vit_fmnist_patch16_224``), or a transformers model
            (``transformers:ORG/REPO``, or a folder ``save_pretrained`` wrote).
        pretrained: load the model's pretrained weights (ignored when ``checkpoint`` is given).
        checkpoint: a weights file to load instead: ``.safetensors``, or ``.pth`` read with ``weights_only``.
        num_classes: classes of the head; None keeps the weights' own, another number gets a new classifier.
        img_size: the square input side in pixels; None: the size the weights were made at.
        drop_path_rate: stochastic depth rate.
        **kwargs: passed to the model (timm: e.g. ``embed_dim``; transformers: config fields).

    Returns:
        The model (``torch.nn.Module``), in training mode, on the CPU.

    Raises:
        UnknownModelError: ``name`` is no model either library knows, nor a path that can be read.
        ConfigError: an argument the model cannot take (a bad ``img_size``, say).
        AdapterError: a ``checkpoint`` that does not fit the model.
        OfflineError: the weights must be downloaded and the hub is off.
    """
    check_type(name, str, "name", "a model name (str), e.g. 'vit_small_patch16_224'")
    options = dict(kwargs, pretrained=pretrained, checkpoint=checkpoint, num_classes=num_classes, img_size=img_size,
                   drop_path_rate=drop_path_rate)
    return library_for_name(name).build(name, options)


def patch_grid(model: nn.Module) -> Optional[tuple[int, int]]:
    """The (H, W) token grid of the patch embedding, or None for models without one."""
    return library_of(model).patch_grid(model)
