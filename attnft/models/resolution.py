"""Resolution change: which input sizes a model accepts, and position tensors resampled to them.

A checkpoint made at one resolution holds position tensors sized for its token grid or
window: absolute position embeddings ``(1, prefix + H*W, C)``, relative-position bias tables
``((2Wh-1)*(2Ww-1) + extra, heads)`` and MViTv2's decomposed tables ``(2L-1, head_dim)``.
:func:`resample_state_dict` resizes those to the sizes of a model built at the new
resolution, with timm's own helpers and timm's defaults (bicubic, antialiased; linear for
MViTv2's tables), so the result matches what timm's checkpoint filters do for the families
they cover (ViT, DeiT, BEiT, EVA, Swin, MViTv2) and extends it to those they skip (CaiT, Hiera).
Which tensors are sized by the grid, and their layout, the role map says
(:meth:`attnft.roles.RoleMap.grid_tensors`, from the family tables); this module only resamples.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Optional

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed, resize_rel_pos_bias_table
from torch import nn

from ..core.errors import ConfigError
from ..roles import RoleMap, build_role_map, split_last

__all__ = ["resample_state_dict", "required_multiple", "check_img_size", "check_img_size_value", "check_token_count",
           "MAX_TOKENS"]

# The most patch tokens an input may have: a 512 x 512 grid (8192 px at 16 px patches, Swin at 2048 px).
# Beyond it one image's activations (and a ViT's position embedding, resampled in float32) no longer
# fit any accelerator: such a --res is a typo, and building the model would exhaust memory first.
MAX_TOKENS = 512 * 512


def resample_state_dict(state_dict: Mapping[str, torch.Tensor], model: nn.Module,
                        role_map: Optional[RoleMap] = None) -> dict[str, torch.Tensor]:
    """A copy of ``state_dict`` whose position tensors have the shapes ``model`` needs.

    Only tensors whose key is in the model and whose shape differs are touched, and only
    position tensors among them that differ in their position axis alone; other mismatches
    (a classifier for other classes, another embedding width) are returned as they are for
    the loader to judge. ``model`` may live on the meta device. Raises ConfigError naming a
    position tensor whose grid or window cannot be adapted (e.g. a non-square source grid).
    Which tensors are position tensors, and their layout, the role map says (``grid_tensors``).
    """
    grid = (role_map or build_role_map(model)).grid_tensors()
    targets = model.state_dict(keep_vars=True)
    out = dict(state_dict)
    for key, value in state_dict.items():
        target = targets.get(key)
        if target is None or tuple(value.shape) == tuple(target.shape):
            continue
        layout = grid.get(key)
        if layout is None:
            continue
        if not _differs_only_in_positions(layout, value.shape, target.shape):
            continue  # another width or head count: not a resolution change
        owner = model.get_submodule(split_last(key)[0])
        try:
            out[key] = _RESAMPLERS[layout](value, tuple(target.shape), owner)
        except (ValueError, RuntimeError, AssertionError) as e:
            raise ConfigError(
                f"cannot resample {key} from {tuple(value.shape)} to {tuple(target.shape)}: {e}"
            ) from e
    return out


def _differs_only_in_positions(layout: str, have: torch.Size, want: torch.Size) -> bool:
    """Same layout apart from the position axis: (1, N, C) for embeddings, (N, heads or head_dim) for tables."""
    if len(have) != len(want):
        return False
    if layout == "abs_pos_embed":
        return len(have) == 3 and have[0] == want[0] and have[2] == want[2]
    return len(have) == 2 and have[1] == want[1]


def _resample_abs_pos_embed(value: torch.Tensor, shape: tuple[int, ...], owner: nn.Module) -> torch.Tensor:
    """(1, prefix + h*w, C) -> (1, prefix + H*W, C); prefix tokens (cls, dist, registers) kept."""
    new_grid = _token_grid(owner)
    num_prefix = shape[1] - new_grid[0] * new_grid[1]
    old_tokens = value.shape[1] - num_prefix
    side = math.isqrt(max(old_tokens, 0))
    if num_prefix < 0 or side * side != old_tokens:
        raise ValueError(f"{old_tokens} grid tokens after {num_prefix} prefix tokens is not a square grid")
    return resample_abs_pos_embed(value, new_size=list(new_grid), old_size=[side, side], num_prefix_tokens=num_prefix)


def _token_grid(owner: nn.Module) -> tuple[int, int]:
    """The (H, W) patch grid the owner of a pos_embed adds it to."""
    patch_embed = getattr(owner, "patch_embed", None)
    grid = getattr(patch_embed, "grid_size", None)
    if grid is None:
        grid = getattr(owner, "tokens_spatial_shape", None)  # Hiera
    hf_patches = getattr(owner, "patch_embeddings", None)  # transformers' *Embeddings
    if grid is None and hasattr(hf_patches, "image_size") and hasattr(hf_patches, "patch_size"):
        size, patch = (_pair(getattr(hf_patches, a)) for a in ("image_size", "patch_size"))
        grid = (size[0] // patch[0], size[1] // patch[1])
    if grid is None or len(grid) != 2:
        raise ValueError(f"{type(owner).__name__} does not say its 2-D patch grid")
    return int(grid[0]), int(grid[1])


def _pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _resize_rel_pos_bias_table(value: torch.Tensor, shape: tuple[int, ...], owner: nn.Module) -> torch.Tensor:
    """((2w-1)^2 + extra, heads) -> ((2W-1)^2 + extra, heads); BEiT's extra cls entries kept."""
    window = getattr(owner, "window_size", None)
    if window is None:
        raise ValueError(f"{type(owner).__name__} does not say its window size")
    window = _pair(window)
    return resize_rel_pos_bias_table(value, new_window_size=window, new_bias_shape=shape)


def _resize_decomposed_rel_pos(value: torch.Tensor, shape: tuple[int, ...], owner: nn.Module) -> torch.Tensor:
    """(2l-1, head_dim) -> (2L-1, head_dim), linearly, as timm's MViTv2 checkpoint filter does."""
    resized = F.interpolate(value.float().t().unsqueeze(0), size=shape[0], mode="linear")
    return resized.squeeze(0).t().to(value.dtype)


Resampler = Callable[[torch.Tensor, tuple[int, ...], nn.Module], torch.Tensor]
# layout of a grid-sized tensor (the role map's grid_tensors) -> how to resample it to the shape the model needs
_RESAMPLERS: dict[str, Resampler] = {
    "abs_pos_embed": _resample_abs_pos_embed,
    "rel_pos_bias_table": _resize_rel_pos_bias_table,
    "decomposed_rel_pos": _resize_decomposed_rel_pos,
}

def required_multiple(model: nn.Module) -> int:
    """The number of pixels an input side must be a multiple of: the model's total stride.

    For a plain ViT that is the patch size; for hierarchical models (Swin, Hiera, PVTv2,
    MViTv2) it is the patch size times every downsampling, so each stage's grid is whole
    (Hiera additionally needs whole mask units, which its total stride covers).
    """
    feature_info = getattr(model, "feature_info", None)
    if feature_info:
        return int(feature_info[-1]["reduction"])
    patch_size = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if patch_size is not None:
        return int(patch_size if isinstance(patch_size, int) else max(patch_size))
    return 1


def check_img_size_value(img_size: object) -> None:
    """Raise ConfigError unless ``img_size`` is a positive whole number of pixels."""
    if not isinstance(img_size, int) or isinstance(img_size, bool) or img_size <= 0:
        raise ConfigError(f"image size must be a positive number of pixels, got {img_size!r}")


def patch_size(model: nn.Module) -> int:
    """The pixels one token of the first stage covers (a side); the total stride if the model has no patch size."""
    size = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if size is not None:
        return int(size if isinstance(size, int) else max(size))
    return required_multiple(model)


def check_token_count(model: nn.Module, img_size: int, model_name: str) -> None:
    """Raise ConfigError if ``img_size`` (pixels, square) gives more than :data:`MAX_TOKENS` patch tokens.

    ``model`` may be a skeleton at any size (the meta device): only its patch size is read.
    """
    check_img_size_value(img_size)
    patch = max(1, patch_size(model))
    tokens = (img_size // patch) ** 2
    if tokens > MAX_TOKENS:
        largest = math.isqrt(MAX_TOKENS) * patch
        raise ConfigError(
            f"image size {img_size} gives {tokens:,} tokens of {patch} px patches for {model_name}, far more than "
            f"fits in memory: at most {MAX_TOKENS:,} tokens, i.e. --res up to {largest}"
        )


def check_img_size(model: nn.Module, img_size: int, model_name: str) -> None:
    """Raise ConfigError unless ``img_size`` (pixels, square) fits the model's stride."""
    check_img_size_value(img_size)
    multiple = required_multiple(model)
    if img_size % multiple:
        below, above = img_size // multiple * multiple, (img_size // multiple + 1) * multiple
        nearest = f"{below} or {above}" if below else f"{above}"
        raise ConfigError(
            f"image size {img_size} does not fit {model_name}: it must be a multiple of {multiple} "
            f"(the model's patch size times its downsampling); use {nearest}"
        )
