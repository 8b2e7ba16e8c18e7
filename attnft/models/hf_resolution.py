"""Resolution change for transformers models: a model rebuilt for another input size, its tensors kept.

The absolute position embedding is computed once by the model's own ``interpolate_pos_encoding``
(so the model at the new size computes what ``model(x, interpolate_pos_encoding=True)`` of the
checkpoint computes); relative-position tables and embeddings without such a method are
resampled as timm's checkpoint filters do (:mod:`timm.layers`). Index buffers are the new
model's own, computed from its config. The rebuilt model is in the source's train / eval mode;
a source whose tensors are not the plain model's (an adapter injected: peft's LoRA layers) is
refused rather than rebuilt without them.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from ..core.errors import AdapterError, ConfigError
from .hf_config import patch_side, vision_config
from .resolution import MAX_TOKENS
from ..roles import Role, build_role_map, module_of

__all__ = ["check_size", "at_size"]


def check_size(model: nn.Module, size: int, name: str) -> None:
    """ConfigError unless ``size`` px is a whole number of patches and not absurdly many."""
    patch = patch_side(model.config)
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
    vision_config(config).image_size = size
    reference = next(model.parameters())
    config.dtype = reference.dtype  # else _from_config builds in the checkpoint's saved dtype and rounds the weights
    plain = getattr(type(model), "_attnft_plain_class", type(model))
    target = plain._from_config(config)
    # _from_config builds it in train mode, and its modules replace the model's: each takes the mode of the
    # module it replaces (dropout and drop path off in a model in eval mode)
    modes = {path: module.training for path, module in model.named_modules()}
    for path, module in target.named_modules():
        module.training = modes.get(path, model.training)
    have = model.state_dict()
    roles = build_role_map(model)
    layouts = roles.grid_tensors()  # which tensors follow the grid, and how
    positions = set(roles.names_with_role(Role.POS_EMBED))  # CLIP's nn.Embedding weight too
    buffers = {name for name, _ in target.named_buffers()}
    wanted = target.state_dict()
    lost = [k for k in wanted if k not in have and k not in buffers]
    extra = [k for k in have if k not in wanted]
    if lost or extra:
        found = f"it has no {lost[0]}" if lost else f"it holds {extra[0]}, which {type(model).__name__} has not"
        raise AdapterError(f"cannot rebuild {type(model).__name__} for {size} px: {found} (an adapter injected? "
                           "set the input size before adding one)")
    state = {}
    for key, want in wanted.items():
        value = have.get(key)
        if value is None or value.shape == want.shape:
            state[key] = want if value is None else value  # None: a buffer the model lacks, the new model's own
        elif key in buffers:
            state[key] = want  # index tables computed from the config at the new size
        else:
            state[key] = _resampled(model, target, layouts, positions, key, value, tuple(want.shape), size)
    target.load_state_dict(state)
    # what trains stays as it was (a frozen base stays frozen); hooks on the old modules are not carried over
    trains = {name: p.requires_grad for name, p in model.named_parameters()}
    for name, param in target.named_parameters():
        param.requires_grad_(trains.get(name, param.requires_grad))
    return target.to(device=reference.device, dtype=reference.dtype)


def _interpolator(model: nn.Module, path: str):
    """The ``interpolate_pos_encoding`` of module ``path`` or the nearest module above it (CLIP's is the
    embeddings module above its ``nn.Embedding``); None if none has one."""
    while path:
        fn = getattr(model.get_submodule(path), "interpolate_pos_encoding", None)
        if callable(fn):
            return fn
        path = module_of(path)
    return None


def _resampled(model: nn.Module, target: nn.Module, layouts: dict[str, str], positions: set[str], key: str,
               value: torch.Tensor, shape: tuple, size: int) -> torch.Tensor:
    """``value`` of ``key`` at the shape the model at ``size`` px needs: the owner's own interpolation, else timm's."""
    from timm.layers import resample_abs_pos_embed, resize_rel_pos_bias_table

    owner_name = module_of(key)
    layout = layouts.get(key) or ("abs_pos_embed" if key in positions else None)
    with torch.no_grad():
        interpolate = _interpolator(model, owner_name) if layout == "abs_pos_embed" else None
        if interpolate is not None and len(shape) >= 2:
            # (1, tokens, C), or CLIP's (tokens, C) table; the method reads only the tokens and C of its input
            try:
                out = interpolate(torch.zeros(1, shape[-2], shape[-1], dtype=value.dtype), size, size)
            except TypeError:  # e.g. ViT's with a (H, W) patch size, which it divides by: timm's below
                out = None
            if out is not None and out.numel() == math.prod(shape):
                return out.detach().reshape(shape).clone()
        if layout == "rel_pos_bias_table":
            window = target.get_submodule(owner_name).window_size
            window = (window, window) if isinstance(window, int) else tuple(window)
            return resize_rel_pos_bias_table(value, new_window_size=window, new_bias_shape=shape)
        if layout == "abs_pos_embed" and value.ndim == 3 and len(shape) == 3 and value.shape[2] == shape[2]:
            grid = size // patch_side(model.config)
            prefix = shape[1] - grid * grid
            old_side = math.isqrt(value.shape[1] - prefix)
            if prefix >= 0 and old_side * old_side == value.shape[1] - prefix:
                return resample_abs_pos_embed(value, new_size=[grid, grid], old_size=[old_side, old_side],
                                              num_prefix_tokens=prefix)
    raise ConfigError(f"cannot resample {key} from {tuple(value.shape)} to {shape} for {size} px")
