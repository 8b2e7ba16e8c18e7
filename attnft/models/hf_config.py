"""What a transformers config says about a vision model's shape: the vision part, the patch and image sides.

Below both the transformers model source (:mod:`.hf_models`) and its resizing (:mod:`.hf_resolution`).
"""
from __future__ import annotations


def vision_config(config):
    """The config that holds the image and patch size: CLIP's ``vision_config``, else ``config`` itself."""
    return getattr(config, "vision_config", None) or config


def _side(value) -> int:
    return int(value[-1] if isinstance(value, (list, tuple)) else value)


def patch_side(config) -> int:
    """The patch side in pixels of a transformers config (an int, or (H, W) as some configs write it)."""
    return _side(vision_config(config).patch_size)


def image_side(config) -> int:
    """The input side in pixels of a transformers config (an int or (H, W))."""
    return _side(vision_config(config).image_size)
