"""SSF's computing layers on timm's VisionTransformer (and transformers' ViT / DeiT): ``out * scale + shift`` after
chosen modules, by forward hooks.

As the authors' code (dongzelian/SSF, models/vision_transformer.py: ``init_ssf_scale_shift``, ``ssf_ada``), SSF
follows the patch embedding's projection (and its norm if any), every linear of each block (``attn.qkv``,
``attn.proj``, ``mlp.fc1``, ``mlp.fc2``; a parallel block's fused ``in_proj`` and output projections), every norm of
each block (``norm1``, ``norm2``, qk-norms where the model has them) and the norms around the blocks (``norm_pre``,
``norm``, ``fc_norm``, whichever are norms, not Identity). Unlike the authors' wrapped modules, the parameters are
registered on the followed module itself (``blocks.0.attn.qkv.ssf_scale``), so the base's names do not change.
transformers' ViT / DeiT image classifiers likewise: the patch projection, every linear and LayerNorm of each layer
(``q_proj`` ... ``mlp.fc2``, ``layernorm_before`` / ``_after``) and the final ``layernorm``.

Each scale / shift is ``[T, C]``: one row per task (see :mod:`attnft.methods.rows`); a forward picks the batch's rows.
:func:`merge` folds a single task into the layer before each pair, leaving a plain model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from timm.layers import RmsNorm, SimpleNorm
from timm.models.vision_transformer import (
    Block,
    ParallelScalingBlock,
    ParallelThingsBlock,
    ResPostBlock,
    VisionTransformer,
)
from torch import nn

from ...core.errors import ConfigError
from ..added.backbones import transformers_backbone
from ..added.hooks import keep_handle, remove_handles
from ..rows import pick

FAMILY = "ssf"
PREFIX = "ssf_"
SCALE = PREFIX + "scale"
SHIFT = PREFIX + "shift"
_HOOKS = PREFIX + "hooks"  # a plain attribute (no tensor) on each hooked module: its hook handles

SUPPORTED = ("timm's VisionTransformer family (ViT, DeiT, DeiT III, distilled DeiT, register tokens, "
             "ResPost and parallel blocks) and transformers' ViT / DeiT image classifiers")
_BLOCKS = (Block, ResPostBlock, ParallelScalingBlock, ParallelThingsBlock)
_NORMS = (nn.LayerNorm, nn.RMSNorm, RmsNorm, SimpleNorm)  # timm's LayerNorm subclasses nn.LayerNorm


@dataclass(frozen=True)
class Options:
    """SSF has no options: it follows every module named in the module docstring."""


def check_model(model: nn.Module) -> None:
    """Raises:
        ConfigError: ``model`` is not a timm VisionTransformer with a convolutional patch projection and blocks
            SSF knows, nor a transformers ViT / DeiT image classifier.
    """
    backbone = transformers_backbone(model)
    if backbone is not None:
        if not isinstance(getattr(backbone, "layers", None), nn.ModuleList):
            raise ConfigError(f"ssf supports transformers' ViT / DeiT with their layers in .layers (transformers 5); "
                              f"this {type(model).__name__} has none")
        return
    if not isinstance(model, VisionTransformer):
        raise ConfigError(f"ssf supports {SUPPORTED}, not {type(model).__name__}")
    if not isinstance(getattr(model.patch_embed, "proj", None), nn.Conv2d):
        raise ConfigError(f"ssf supports {SUPPORTED} with a convolutional patch embedding, not "
                          f"{type(model.patch_embed).__name__}")
    other = sorted({type(block).__name__ for block in model.blocks if not isinstance(block, _BLOCKS)})
    if other:
        raise ConfigError(f"ssf supports {SUPPORTED}; its blocks {', '.join(other)} are not supported")


def targets(model: nn.Module) -> list[nn.Module]:
    """The modules SSF follows (each once), by block."""
    backbone = transformers_backbone(model)
    if backbone is not None:
        inside = [module for layer in backbone.layers for module in layer.modules() if _followed(module)]
        return [backbone.embeddings.patch_embeddings.projection] + inside + [backbone.layernorm]
    around = [model.patch_embed.proj, getattr(model.patch_embed, "norm", None), model.norm_pre]
    inside = [module for block in model.blocks for module in block.modules() if _followed(module)]
    found = [m for m in around if _followed(m)] + inside + [m for m in (model.norm, model.fc_norm) if _followed(m)]
    return list(dict.fromkeys(found))


def _followed(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, nn.Conv2d) + _NORMS)


def _channels(module: nn.Module) -> int:
    """The size of ``module``'s output channel dimension."""
    if isinstance(module, nn.Linear):
        return module.out_features
    if isinstance(module, nn.Conv2d):
        return module.out_channels
    return tuple(module.normalized_shape)[-1]


def add(model: nn.Module, options: Options = Options(), tasks: int = 1) -> list[str]:
    """Installs a scale and shift ``[tasks, C]`` on every module of :func:`targets` and the hook that applies them.

    Args:
        model: a timm VisionTransformer or transformers ViT / DeiT (see :func:`check_model`); its own parameters
            are left as they are.
        options: SSF's (empty) options.
        tasks: rows per tensor. 1: the authors' training init, scale ~ N(1, 0.02) and shift ~ N(0, 0.02);
            more (a multi-task server fills the rows): every row the identity, scale 1 and shift 0.

    Returns:
        The names of the new parameters, as in ``model.state_dict()``, all trainable.
    """
    check_model(model)
    if not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1:
        raise ConfigError(f"ssf: tasks must be a positive integer, not {tasks!r}")
    if any(hasattr(module, SCALE) for module in model.modules()):
        raise ConfigError("ssf is already added to this model")
    followed = targets(model)
    reference = followed[0].weight  # the patch projection's
    added = []
    for module in followed:
        scale = torch.ones(tasks, _channels(module), device=reference.device, dtype=reference.dtype)
        shift = torch.zeros_like(scale)
        if tasks == 1:
            nn.init.normal_(scale, mean=1.0, std=0.02)
            nn.init.normal_(shift, std=0.02)
        module.register_parameter(SCALE, nn.Parameter(scale))
        module.register_parameter(SHIFT, nn.Parameter(shift))
        keep_handle(module, _HOOKS, module.register_forward_hook(_scale_shift))
        added += [getattr(module, SCALE), getattr(module, SHIFT)]
    ids = {id(p) for p in added}
    return [name for name, p in model.named_parameters() if id(p) in ids]


def _scale_shift(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    """``out * scale + shift`` per channel: the last dimension, or dimension 1 of a convolution's NCHW output.

    A copy of the module that holds no SSF tensors (another family's task clone on a shared base, which shares the
    module's hooks but not its parameters) is not SSF's: its output passes unchanged."""
    if SCALE not in module._parameters:
        return out
    scale, shift = pick(getattr(module, SCALE), FAMILY), pick(getattr(module, SHIFT), FAMILY)  # [1 or B, C]
    if isinstance(module, nn.Conv2d):
        shape = (scale.shape[0], -1) + (1,) * (out.dim() - 2)
    else:
        shape = (scale.shape[0],) + (1,) * (out.dim() - 2) + (-1,)
    return out * scale.view(shape) + shift.view(shape)


def remove(model: nn.Module) -> None:
    """Removes every SSF hook and parameter: ``model`` is the plain base again."""
    remove_handles(model, _HOOKS)
    for module in model.modules():
        if hasattr(module, SCALE):
            delattr(module, SCALE)
            delattr(module, SHIFT)


@torch.no_grad()
def merge(model: nn.Module) -> None:
    """Folds every SSF scale ``s`` and shift ``t`` (one task) into the module before it, then :func:`remove`.

    Linear / Conv2d: ``W' = s * W`` per output channel, ``b' = s * b + t``; norm: ``w' = s * w``, ``b' = s * b + t``.
    Afterwards ``model``'s state dict is a plain model's (timm's or transformers'), with the same outputs.

    Raises:
        ConfigError: the tensors hold several tasks, or a followed module has no bias (or no weight) to take the
            shift (e.g. ``qkv_bias=False``, an RmsNorm): nothing is changed then.
    """
    followed = [(name, module) for name, module in model.named_modules() if hasattr(module, SCALE)]
    for name, module in followed:
        if getattr(module, SCALE).shape[0] != 1:
            raise ConfigError(f"ssf merge folds one task; {name} holds {getattr(module, SCALE).shape[0]}")
        norm = not isinstance(module, (nn.Linear, nn.Conv2d))
        if getattr(module, "bias", None) is None or (norm and getattr(module, "weight", None) is None):
            raise ConfigError(f"ssf merge: {name or 'the model'} ({type(module).__name__}) has no "
                              f"{'affine weight and bias' if norm else 'bias'} to fold the scale and shift into")
    for _, module in followed:
        scale, shift = getattr(module, SCALE)[0], getattr(module, SHIFT)[0]
        weight = module.weight
        weight.copy_(weight * scale.view((-1,) + (1,) * (weight.dim() - 1)))
        module.bias.copy_(module.bias * scale + shift)
    remove(model)


__all__ = ["FAMILY", "PREFIX", "SCALE", "SHIFT", "SUPPORTED", "Options", "add", "check_model", "merge", "remove",
           "targets"]
