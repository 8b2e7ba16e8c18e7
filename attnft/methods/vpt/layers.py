"""VPT's computing layers on timm's VisionTransformer (and transformers' ViT / DeiT): learned prompt tokens, by hooks.

As the authors' code (KMnP/vpt, src/models/vit_prompt/vit.py, ``PromptedTransformer``), ``n`` prompts sit right
after the prefix tokens (class, register and distillation tokens: ``model.num_prefix_tokens``), before the patch
tokens, without position embedding: they enter after ``_pos_embed``, ``patch_drop`` and ``norm_pre``, just before
block 0. Deep (the default): block ``i > 0`` gets layer ``i``'s own prompts in place of the previous block's prompt
outputs; shallow: the first prompts go through every block. After the last block the prompt tokens are dropped, so
the final norm, the pooling (class token, or the mean over the patch tokens) and the head see the usual tokens.
The authors pool the class token of the full sequence; a mean over patch tokens would otherwise include the prompts.

Init as the authors' (``INITIATION="random"``): uniform(-v, v), ``v = sqrt(6 / (3 * patch_h * patch_w + D))``,
xavier-like for a ``3 x patch`` fan-in. The authors' prompt dropout (``PROMPT.DROPOUT``, 0 by default in their
config, 0.1 in some of their runs) is :attr:`Options.dropout`, 0 by default. Their optional projection of the
prompts (``PROJECT``) is left out, as in their default.

One parameter on the model's root, ``vpt_prompts`` ``[T, L, n, D]`` (``L`` = blocks when deep, 1 when shallow), one
row per task (see :mod:`attnft.methods.rows`). The first prompts are inserted by a forward hook on ``norm_pre``,
outside the blocks, so timm's gradient checkpointing (``checkpoint_seq``, re-entrant or not) still trains them.
Not supported: attention masks passed to the blocks, and ``forward_intermediates`` (its block outputs hold the
prompts).

transformers' ViT / DeiT image classifiers likewise: the prompts enter at the embeddings' output (after the class and,
for DeiT, distillation token) and leave after the last layer, before the final ``layernorm``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from ...core.errors import ConfigError
from ..added.backbones import transformers_backbone
from ..added.hooks import keep_handle, remove_handles
from ..rows import pick

FAMILY = "vpt"
PREFIX = "vpt_"
PROMPTS = PREFIX + "prompts"  # the parameter on the model's root
_HOOKS = PREFIX + "hooks"  # a plain attribute (no tensor) on each hooked module: its hook handles

SUPPORTED = ("timm's VisionTransformer family (ViT, DeiT, DeiT III, distilled DeiT, register tokens, parallel blocks) "
             "and transformers' ViT / DeiT image classifiers")


@dataclass(frozen=True)
class Options:
    """Args:
        tokens: prompt tokens per layer (n).
        deep: new prompts at every block's input (VPT-deep); False: only before block 0 (VPT-shallow).
        dropout: dropout on the prompts in training (the authors' ``PROMPT.DROPOUT``).
    """

    tokens: int = 10
    deep: bool = True
    dropout: float = 0.0

    def __post_init__(self):
        if not isinstance(self.tokens, int) or isinstance(self.tokens, bool) or self.tokens < 1:
            raise ConfigError(f"vpt: tokens must be a positive integer, not {self.tokens!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"vpt: dropout must be in [0, 1), not {self.dropout!r}")


class _Sequence(NamedTuple):
    """Where the prompts go in a model's token sequence."""

    entry: nn.Module  # its forward output is the sequence block 0 reads: [B, P + N, D]
    blocks: nn.ModuleList  # or nn.Sequential
    prefix: int  # P: class, register and distillation tokens
    dim: int  # D
    patch: int  # pixels per patch (h * w), for the init


def _sequence(model: nn.Module) -> _Sequence:
    backbone = transformers_backbone(model)
    if backbone is None:
        return _Sequence(model.norm_pre, model.blocks, model.num_prefix_tokens, model.embed_dim,
                         math.prod(model.patch_embed.patch_size))
    config, embeddings = backbone.config, backbone.embeddings
    patch = config.patch_size if isinstance(config.patch_size, (tuple, list)) else (config.patch_size,) * 2
    prefix = 1 + (getattr(embeddings, "distillation_token", None) is not None)
    return _Sequence(embeddings, backbone.layers, prefix, config.hidden_size, math.prod(patch))


def check_model(model: nn.Module) -> None:
    """Raises:
        ConfigError: ``model`` is neither a timm VisionTransformer nor a transformers ViT / DeiT image classifier.
    """
    backbone = transformers_backbone(model)
    if backbone is not None:
        if not isinstance(getattr(backbone, "layers", None), nn.ModuleList):
            raise ConfigError(f"vpt supports transformers' ViT / DeiT with their layers in .layers (transformers 5); "
                              f"this {type(model).__name__} has none")
    elif not isinstance(model, VisionTransformer):
        raise ConfigError(f"vpt supports {SUPPORTED}, not {type(model).__name__}")
    if len(_sequence(model).blocks) == 0:
        raise ConfigError("vpt needs a model with at least one block")


def add(model: nn.Module, options: Options = Options(), tasks: int = 1) -> list[str]:
    """Installs ``vpt_prompts`` ``[tasks, L, n, D]`` on ``model`` and the hooks that put them in the sequence.

    Args:
        model: a timm VisionTransformer or transformers ViT / DeiT (see :func:`check_model`); its own parameters
            are left as they are.
        options: the prompts per layer, deep or shallow, and their dropout.
        tasks: rows of the prompts, each drawn with the authors' uniform init (prompts have no identity).

    Returns:
        ``["vpt_prompts"]``, the new parameter's name as in ``model.state_dict()``; it is trainable.
    """
    check_model(model)
    if not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1:
        raise ConfigError(f"vpt: tasks must be a positive integer, not {tasks!r}")
    if hasattr(model, PROMPTS):
        raise ConfigError("vpt is already added to this model")
    sequence, reference = _sequence(model), next(model.parameters())
    layers = len(sequence.blocks) if options.deep else 1
    bound = math.sqrt(6.0 / (3 * sequence.patch + sequence.dim))
    prompts = torch.empty(tasks, layers, options.tokens, sequence.dim, device=reference.device, dtype=reference.dtype)
    nn.init.uniform_(prompts, -bound, bound)
    model.register_parameter(PROMPTS, nn.Parameter(prompts))

    prefix, dropout = sequence.prefix, options.dropout
    entry, last = sequence.entry, sequence.blocks[-1]
    keep_handle(entry, _HOOKS, entry.register_forward_hook(functools.partial(_insert, model, prefix, dropout)))
    for layer in range(1, layers):
        block = sequence.blocks[layer]
        keep_handle(block, _HOOKS, block.register_forward_pre_hook(functools.partial(_replace, model, prefix, dropout,
                                                                               layer)))
    keep_handle(last, _HOOKS, last.register_forward_hook(functools.partial(_drop, model, prefix)))
    return [PROMPTS]


def _prompts(model: nn.Module, dropout: float, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Layer ``layer``'s prompts for the batch ``x`` ``[B, N, D]``: ``[B, n, D]``."""
    prompts = pick(getattr(model, PROMPTS), FAMILY)[:, layer]  # [1 or B, n, D]
    prompts = F.dropout(prompts, dropout, model.training)
    return prompts.to(x.dtype).expand(x.shape[0], -1, -1)


def _insert(model: nn.Module, prefix: int, dropout: float, entry: nn.Module, args: tuple,
            x: torch.Tensor) -> torch.Tensor:
    """Forward hook on ``norm_pre`` (timm) or the embeddings (transformers): ``[B, P + N, D]`` ->
    ``[B, P + n + N, D]``, the prompts after the P prefix tokens."""
    return torch.cat((x[:, :prefix], _prompts(model, dropout, 0, x), x[:, prefix:]), dim=1)


def _replace(model: nn.Module, prefix: int, dropout: float, layer: int, block: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook on block ``layer`` of VPT-deep: its own prompts in place of the previous block's outputs."""
    x, tokens = args[0], getattr(model, PROMPTS).shape[2]
    x = torch.cat((x[:, :prefix], _prompts(model, dropout, layer, x), x[:, prefix + tokens:]), dim=1)
    return (x,) + tuple(args[1:])


def _drop(model: nn.Module, prefix: int, block: nn.Module, args: tuple, x: torch.Tensor) -> torch.Tensor:
    """Forward hook on the last block: ``[B, P + n + N, D]`` -> ``[B, P + N, D]``, the usual tokens."""
    tokens = getattr(model, PROMPTS).shape[2]
    return torch.cat((x[:, :prefix], x[:, prefix + tokens:]), dim=1)


def remove(model: nn.Module) -> None:
    """Removes the prompts and every VPT hook: ``model`` is the plain base again."""
    remove_handles(model, _HOOKS)
    if hasattr(model, PROMPTS):
        delattr(model, PROMPTS)


__all__ = ["FAMILY", "PREFIX", "PROMPTS", "SUPPORTED", "Options", "add", "check_model", "remove"]
