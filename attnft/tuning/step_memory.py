"""How much memory one training step needs at least, from the model's shape before the first batch, and
how much the device has.

The estimate is a lower bound, so that a run it refuses is one that could not have trained: it counts only
what autograd must keep for the backward of the blocks a gradient passes through (those after the first
block with a trainable weight; all of them when the patch embedding, the position embedding or a token
trains), and the batch of images itself. Per image and block of N tokens of width D (pre-norm ViT block):

- each norm's input (N x D each; two: ``norm1``, ``norm2``), which the norm keeps for its own backward;
- q, k and v (3 N x D), and the fused attention's output (N x D); unfused, the softmax's output instead
  (heads x N x N), which the product with v keeps too;
- the FFN's hidden pre-activation, which its activation function keeps (``fc1``'s output: 4 N x D at
  ``mlp_ratio`` 4); under FFN recompute none: the FFN checkpoint keeps its input, the norm's input.

Measured (fp32, fused attention, 257 tokens of width 64), a block keeps about 10.6 N x D frozen with a
gradient passing, 11.4 under ``attn``, 16.6 fully trained; the estimate counts 10. Whole-block gradient
checkpointing keeps each block's input (N x D) and, in the backward, one block recomputed in full.
Everything counts at the smaller of the parameters' and the autocast dtype's size. Not counted: the
weights, their gradients and optimizer state, the activations of the first block with a trainable weight
(when nothing before it trains), the backward's transient gradients. The batches the loader's workers hold in the same RAM are added by the run's check
(:mod:`attnft.training.plan`), which knows the workers.

Only models whose blocks all see the same tokens at the same width are estimated (timm's
``VisionTransformer``, ``Eva``, ``Beit``: ``embed_dim``, ``num_prefix_tokens``, a patch grid, one global
attention with a fused ``qkv`` per block); for any other (Swin, MViT, CaiT, transformers' models)
:func:`estimate_step_memory` returns None rather than guess.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from math import prod
from typing import Optional

import torch
from torch import nn

from ..models import patch_grid
from ..roles import Role, RoleMap

INPUT_SIDE = (Role.PATCH_EMBED, Role.POS_EMBED, Role.TOKENS)  # trained, every block passes a gradient
IMAGE_BYTES = 4  # the loader's batches are float32


@dataclass(frozen=True)
class StepMemory:
    """A lower bound on what one training step holds at once in one process, in bytes."""

    tokens: int  # per image, in every block
    width: int
    blocks: int  # the blocks a gradient passes through, whose activations autograd keeps
    batch_size: int
    activations: int  # bytes those blocks keep for the backward
    images: int  # bytes of the batch itself

    @property
    def total(self) -> int:
        return self.activations + self.images


@dataclass(frozen=True)
class BlockShape:
    """What one block is, for its activations: tokens and width (values per token), its attention's heads,
    whether that attention is fused, its token-wide norms and its FFN's hidden width."""

    tokens: int
    width: int
    heads: int
    fused: bool
    norms: int
    hidden: int  # the FFN's hidden width (fc1's outputs); 0 when the block has none attnft reads

    def kept(self, recompute_ffn: bool = False) -> int:
        """Values the block keeps for its backward, per image."""
        attention = 4 * self.width if self.fused else 3 * self.width + self.heads * self.tokens
        ffn = 0 if recompute_ffn else self.hidden
        return self.tokens * (self.norms * self.width + attention + ffn)


def estimate_step_memory(model: nn.Module, role_map: RoleMap, *, batch_size: int, input_size: tuple[int, ...],
                         compute_itemsize: Optional[int] = None, grad_checkpointing: bool = False,
                         recompute_ffn: bool = False) -> Optional[StepMemory]:
    """A lower bound on one training step's memory at ``batch_size`` images of ``input_size`` (C, H, W) in
    ``model`` as it is frozen now (its blocks as ``role_map`` names them); None for a model whose blocks'
    tokens attnft cannot read. ``compute_itemsize``: bytes per value under autocast (bf16, fp16: 2); None: the
    parameters'."""
    shapes = block_shapes(model, role_map)
    if shapes is None:
        return None
    passing = [shapes[i] for i in blocks_with_gradient(model, role_map)]
    if grad_checkpointing:  # each block's input, and one block recomputed in the backward
        values = (sum(s.tokens * s.width for s in passing)
                  + max((s.kept(recompute_ffn) for s in passing), default=0))
    elif recompute_ffn:  # and one FFN recomputed in the backward
        values = sum(s.kept(True) for s in passing) + max((s.tokens * s.hidden for s in passing), default=0)
    else:
        values = sum(s.kept() for s in passing)
    itemsize = _itemsize(model, compute_itemsize)
    return StepMemory(tokens=shapes[0].tokens, width=shapes[0].width, blocks=len(passing), batch_size=batch_size,
                      activations=values * batch_size * itemsize, images=prod(input_size) * batch_size * IMAGE_BYTES)


def block_shapes(model: nn.Module, role_map: RoleMap) -> Optional[list[BlockShape]]:
    """Every block's shape, in block order; None unless all blocks see the grid's tokens plus the prefix tokens
    at the model's ``embed_dim`` through one global attention with a fused ``qkv``."""
    width, prefix = getattr(model, "embed_dim", None), getattr(model, "num_prefix_tokens", None)
    if not _is_count(width) or not _is_count(prefix) or role_map.num_blocks == 0:
        return None
    grid = patch_grid(model)
    if grid is None:
        return None
    if getattr(getattr(model, "patch_drop", None), "prob", 0) > 0:  # trains on fewer tokens than the grid has
        return None
    modules = dict(model.named_modules())
    tokens = grid[0] * grid[1] + prefix
    shapes = [_block_shape(modules, role_map, index, tokens, width) for index in range(role_map.num_blocks)]
    return None if any(s is None for s in shapes) else shapes


def _block_shape(modules: dict, role_map: RoleMap, index: int, tokens: int, width: int) -> Optional[BlockShape]:
    def inside(role: Role) -> list[nn.Module]:
        return [modules[p] for p in role_map.outermost_modules(role)
                if p in modules and role_map.block_of_module(p) == index]

    attention = inside(Role.ATTENTION)
    qkv = getattr(attention[0], "qkv", None) if len(attention) == 1 else None
    heads = getattr(attention[0], "num_heads", None) if attention else None
    if (qkv is None or getattr(qkv, "in_features", None) != width or getattr(qkv, "out_features", None) != 3 * width
            or not _is_count(heads)):
        return None  # windowed, class-only, pooled or unfused q/k/v projections: not read here
    norms = sum(1 for norm in inside(Role.NORM) if getattr(norm, "weight", None) is not None
                and tuple(norm.weight.shape) == (width,))
    hidden = sum(getattr(getattr(ffn, "fc1", None), "out_features", 0) or 0 for ffn in inside(Role.FFN))
    fused = getattr(attention[0], "fused_attn", True) is not False
    return BlockShape(tokens=tokens, width=width, heads=heads, fused=fused, norms=norms, hidden=hidden)


def blocks_with_gradient(model: nn.Module, role_map: RoleMap) -> range:
    """The indices of the blocks a gradient passes through: all when something before them trains (the patch
    embedding, the position embedding, a token), else those after the first block with a trainable weight."""
    params = dict(model.named_parameters())
    if any(params[e.name].requires_grad for e in role_map if e.role in INPUT_SIDE and e.name in params):
        return range(role_map.num_blocks)
    modules = dict(model.named_modules())
    for index, path in enumerate(role_map.block_paths()):
        if path in modules and any(p.requires_grad for p in modules[path].parameters()):
            return range(index + 1, role_map.num_blocks)
    return range(0)


def _itemsize(model: nn.Module, compute_itemsize: Optional[int]) -> int:
    sizes = [p.element_size() for p in model.parameters() if p.is_floating_point()][:1] or [4]
    return min(sizes[0], compute_itemsize or sizes[0])


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def device_memory(device: torch.device) -> Optional[int]:
    """The memory ``device`` has in all, in bytes: a GPU's, or for the CPU the machine's RAM and swap (a run
    that swaps is slow, but it trains); None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") + _swap_bytes()
        except (ValueError, OSError, AttributeError):  # not a POSIX system that tells
            return None
    return None


def _swap_bytes() -> int:
    """SwapTotal of /proc/meminfo, in bytes; 0 where there is none to read."""
    try:
        with open("/proc/meminfo") as f:
            line = next((line for line in f if line.startswith("SwapTotal:")), "")
    except OSError:
        return 0
    parts = line.split()
    return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else 0
