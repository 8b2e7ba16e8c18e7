"""Resolution change for transformers models: a model rebuilt for another input size, its tensors kept.

The absolute position embedding is computed once by the model's own ``interpolate_pos_encoding``
(so the model at the new size computes what ``model(x, interpolate_pos_encoding=True)`` of the
checkpoint computes); relative-position tables and embeddings without such a method are
resampled as timm's checkpoint filters do (:mod:`timm.layers`). Index buffers are the new
model's own, computed from its config.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from .errors import ConfigError
from .resolution import MAX_TOKENS
from .roles import build_role_map, module_of

__all__ = ["check_size", "at_size"]


def check_size(model: nn.Module, size: int, name: str) -> None:
    """ConfigError unless ``size`` px is a whole number of patches and not absurdly many."""
    patch = model.config.patch_size
    patch = int(patch[-1] if isinstance(patch, (list, tuple)) else patch)
    if size % patch:
        below, above = size // patch * patch, (size // patch + 1) * patch
        raise ConfigError(f"image size {size} does not fit {name}: it must be a multiple of {patch} "
                          f"(the model's patch size); use {f'{below} or {above}' if below else above}")
    if (size // patch) ** 2 > MAX_TOKENS:
        raise ConfigError(f"image size {size} gives {(size // patch) ** 2:,} tokens of {patch} px patches for {name}, "
                          f"far more than fits in memory: --res up to {math.isqrt(MAX_TOKENS) * patch}")


def at_size(model: nn.Module, size: int) -> nn.Module:
    """A new model of ``model``'s class built for ``size`` px, holding ``model``'s tensors, position tensors resampled."""
    config = copy.deepcopy(model.config)
    config.image_size = size
    reference = next(model.parameters())
    plain = getattr(type(model), "_attnft_plain_class", type(model))
    target = plain._from_config(config)
    have = model.state_dict()
    layouts = build_role_map(model).grid_tensors()  # which tensors follow the grid, and how
    buffers = {name for name, _ in target.named_buffers()}
    state = {}
    for key, want in target.state_dict().items():
        value = have.get(key)
        if value is None or value.shape == want.shape:
            state[key] = want if value is None else value
        elif key in buffers:
            state[key] = want  # index tables computed from the config at the new size
        else:
            state[key] = _resampled(model, target, layouts, key, value, tuple(want.shape), size)
    target.load_state_dict(state)
    return target.to(device=reference.device, dtype=reference.dtype)


def _resampled(model: nn.Module, target: nn.Module, layouts: dict[str, str], key: str, value: torch.Tensor, shape: tuple,
               size: int) -> torch.Tensor:
    """``value`` of ``key`` at the shape the model at ``size`` px needs: the owner's own interpolation, else timm's."""
    from timm.layers import resample_abs_pos_embed, resize_rel_pos_bias_table

    owner_name = module_of(key)
    owner = model.get_submodule(owner_name)
    layout = layouts.get(key)
    with torch.no_grad():
        if layout == "abs_pos_embed" and callable(getattr(owner, "interpolate_pos_encoding", None)):
            out = owner.interpolate_pos_encoding(torch.zeros(1, shape[1], shape[-1], dtype=value.dtype), size, size)
            if tuple(out.shape) == shape:
                return out.detach().clone()
        if layout == "rel_pos_bias_table":
            window = target.get_submodule(owner_name).window_size
            window = (window, window) if isinstance(window, int) else tuple(window)
            return resize_rel_pos_bias_table(value, new_window_size=window, new_bias_shape=shape)
        if layout == "abs_pos_embed" and value.ndim == 3 and len(shape) == 3 and value.shape[2] == shape[2]:
            patch = model.config.patch_size
            grid = size // int(patch[-1] if isinstance(patch, (list, tuple)) else patch)
            prefix = shape[1] - grid * grid
            old_side = math.isqrt(value.shape[1] - prefix)
            if prefix >= 0 and old_side * old_side == value.shape[1] - prefix:
                return resample_abs_pos_embed(value, new_size=[grid, grid], old_size=[old_side, old_side],
                                              num_prefix_tokens=prefix)
    raise ConfigError(f"cannot resample {key} from {tuple(value.shape)} to {shape} for {size} px")
