"""AdaptFormer's computing layers on timm's VisionTransformer (and transformers' ViT / DeiT): a bottleneck beside
each block's FFN, by hooks.

Per block, with ``h = norm2(x)`` the FFN's own normalised input::

    x = x + drop_path2(ls2(mlp(h))) + scale * up(relu(down(h)))

The paper's equation feeds ``LN(x)`` to the bottleneck, which is what this does: it reuses the block's ``norm2``
output. The authors' code (ShoufaChen/AdaptFormer, models/custom_modules.py with
``ffn_adapter_layernorm_option="none"``) feeds the un-normalised ``x`` instead. As there, the bottleneck's output is
added outside the FFN's drop path; it is outside DeiT III's layer scale ``ls2`` too (the authors' blocks have none),
so a layer scale of 1e-5 does not mute it. Parallel blocks: a ``ParallelScalingBlock`` takes the bottleneck on its
shared ``in_norm`` output, added to the block's output; a ``ParallelThingsBlock`` one per FFN branch, on the branch's
``norm`` output, added to the branch's output (after its ``ls`` and ``drop_path``). transformers' ViT / DeiT layers:
on ``layernorm_after``'s output, added to the layer's output (after its dropout and residual).

Init as the authors' ``init_option="lora"``: ``down`` kaiming-uniform (a = sqrt(5), as ``nn.Linear``), its bias and
all of ``up`` zero, so a fresh adapter leaves the logits exactly the base's. The authors' bottleneck dropout is 0.1;
here :attr:`Options.dropout` defaults to 0.

Hooks: the FFN's input norm computes the bottleneck (a forward hook) and keeps its output, per thread, until the
forward hook of the block (or branch) adds it. Every tensor is stacked per task ``[T, ...]`` (see
:mod:`attnft.methods.rows`); a forward gathers the batch's rows and runs one batched matmul, no per-task loop.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import (
    Block,
    ParallelScalingBlock,
    ParallelThingsBlock,
    VisionTransformer,
)
from torch import nn

from ...core.errors import ConfigError
from ..added.backbones import transformers_backbone
from ..added.hooks import keep_handle, remove_handles
from ..rows import pick

FAMILY = "adaptformer"
PREFIX = "adaptformer_"
ADAPTER = PREFIX + "adapter"  # the module on a block
ADAPTERS = PREFIX + "adapters"  # a ParallelThingsBlock's, one per FFN branch
_HOOKS = PREFIX + "hooks"  # a plain attribute (no tensor) on each hooked module: its hook handles

SUPPORTED = ("timm's VisionTransformer family (ViT, DeiT, DeiT III, distilled DeiT, register tokens, parallel blocks) "
             "and transformers' ViT / DeiT image classifiers")
_BLOCKS = (Block, ParallelScalingBlock, ParallelThingsBlock)


@dataclass(frozen=True)
class Options:
    """Args:
        dim: the bottleneck's width r (the authors' ``ffn_num``).
        scale: the factor s on the bottleneck's output (the authors' ``ffn_adapter_scalar``).
        dropout: dropout on the bottleneck's ReLU output in training (the authors' code: 0.1).
    """

    dim: int = 64
    scale: float = 0.1
    dropout: float = 0.0

    def __post_init__(self):
        if not isinstance(self.dim, int) or isinstance(self.dim, bool) or self.dim < 1:
            raise ConfigError(f"adaptformer: dim must be a positive integer, not {self.dim!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"adaptformer: dropout must be in [0, 1), not {self.dropout!r}")


class Bottleneck(nn.Module):
    """``scale * up(relu(down(x)))``, each sample with its task's row: x ``[B, N, D]`` -> ``[B, N, D]``.

    Parameters: ``down_weight`` ``[T, D, r]``, ``down_bias`` ``[T, r]``, ``up_weight`` ``[T, r, D]``,
    ``up_bias`` ``[T, D]``.
    """

    def __init__(self, dim: int, width: int, scale: float, dropout: float, tasks: int, reference: torch.Tensor):
        super().__init__()
        like = {"device": reference.device, "dtype": reference.dtype}
        down = torch.empty(tasks, width, dim, **like)
        for row in down:  # stored [D, r] for x @ W; drawn [r, D] as an nn.Linear's weight for the same fan-in
            nn.init.kaiming_uniform_(row, a=math.sqrt(5))
        self.down_weight = nn.Parameter(down.transpose(1, 2).contiguous())
        self.down_bias = nn.Parameter(torch.zeros(tasks, width, **like))
        self.up_weight = nn.Parameter(torch.zeros(tasks, width, dim, **like))
        self.up_bias = nn.Parameter(torch.zeros(tasks, dim, **like))
        self.scale, self.dropout = scale, dropout
        self._kept: dict[int, torch.Tensor] = {}  # thread -> the output waiting for the block's hook

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        down_weight, down_bias, up_weight, up_bias = (
            pick(p, FAMILY) for p in (self.down_weight, self.down_bias, self.up_weight, self.up_bias))
        hidden = torch.baddbmm(down_bias.unsqueeze(1), x, down_weight.expand(batch, -1, -1)).relu()
        hidden = F.dropout(hidden, self.dropout, self.training)
        return torch.baddbmm(up_bias.unsqueeze(1), hidden, up_weight.expand(batch, -1, -1)) * self.scale

    def extra_repr(self) -> str:
        tasks, dim, width = self.down_weight.shape
        return f"tasks={tasks}, dim={dim}, width={width}, scale={self.scale}, dropout={self.dropout}"

    def keep(self, norm: nn.Module, args: tuple, out: torch.Tensor) -> None:
        """Forward hook on the FFN's input norm: computes the bottleneck on its output and keeps it."""
        self._kept[threading.get_ident()] = self(out)

    def add_kept(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        """Forward hook on the block (or FFN branch): its output plus the kept bottleneck output."""
        return out + self._kept.pop(threading.get_ident())


def check_model(model: nn.Module) -> None:
    """Raises:
        ConfigError: ``model`` is not a timm VisionTransformer whose blocks all have an FFN AdaptFormer knows, nor a
            transformers ViT / DeiT image classifier.
    """
    backbone = transformers_backbone(model)
    if backbone is not None:
        if not isinstance(getattr(backbone, "layers", None), nn.ModuleList):
            raise ConfigError(f"adaptformer supports transformers' ViT / DeiT with their layers in .layers "
                              f"(transformers 5); this {type(model).__name__} has none")
        return
    if not isinstance(model, VisionTransformer):
        raise ConfigError(f"adaptformer supports {SUPPORTED}, not {type(model).__name__}")
    other = sorted({type(block).__name__ for block in model.blocks if not isinstance(block, _BLOCKS)})
    if other:
        raise ConfigError(f"adaptformer supports {SUPPORTED}; its blocks {', '.join(other)} are not supported")


def _sites(block: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    """(the FFN's input norm, the module whose output takes the bottleneck's) per FFN of ``block``."""
    if isinstance(block, ParallelThingsBlock):
        return [(ffn.norm, ffn) for ffn in block.ffns]
    if isinstance(block, ParallelScalingBlock):
        return [(block.in_norm, block)]
    if isinstance(block, Block):
        return [(block.norm2, block)]
    return [(block.layernorm_after, block)]  # a transformers ViT / DeiT layer


def add(model: nn.Module, options: Options = Options(), tasks: int = 1) -> list[str]:
    """Installs a :class:`Bottleneck` beside every FFN of ``model``.

    Args:
        model: a timm VisionTransformer or transformers ViT / DeiT (see :func:`check_model`); its own parameters
            are left as they are.
        options: the bottleneck's width, scale and dropout.
        tasks: rows per tensor. Every row: ``down`` kaiming-uniform, the rest zero (the authors' training init;
            ``up`` zero makes each row the identity until trained or filled by a multi-task server).

    Returns:
        The names of the new parameters, as in ``model.state_dict()`` (``blocks.0.adaptformer_adapter.up_weight``),
        all trainable.
    """
    check_model(model)
    if not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1:
        raise ConfigError(f"adaptformer: tasks must be a positive integer, not {tasks!r}")
    if any(isinstance(module, Bottleneck) for module in model.modules()):
        raise ConfigError("adaptformer is already added to this model")
    backbone = transformers_backbone(model)
    blocks = model.blocks if backbone is None else backbone.layers
    dim = model.embed_dim if backbone is None else backbone.config.hidden_size
    reference = next(model.parameters())
    added = []
    for block in blocks:
        adapters = []
        for norm, output in _sites(block):
            adapter = Bottleneck(dim, options.dim, options.scale, options.dropout, tasks, reference)
            keep_handle(norm, _HOOKS, norm.register_forward_hook(adapter.keep))
            keep_handle(output, _HOOKS, output.register_forward_hook(adapter.add_kept))
            adapters.append(adapter)
        if isinstance(block, ParallelThingsBlock):
            block.add_module(ADAPTERS, nn.ModuleList(adapters))
        else:
            block.add_module(ADAPTER, adapters[0])
        added += [p for adapter in adapters for p in adapter.parameters()]
    ids = {id(p) for p in added}
    return [name for name, p in model.named_parameters() if id(p) in ids]


def remove(model: nn.Module) -> None:
    """Removes every AdaptFormer hook and bottleneck: ``model`` is the plain base again."""
    remove_handles(model, _HOOKS)
    for block in list(model.modules()):
        for name in (ADAPTER, ADAPTERS):
            if hasattr(block, name):
                delattr(block, name)


__all__ = ["ADAPTER", "ADAPTERS", "FAMILY", "PREFIX", "SUPPORTED", "Bottleneck", "Options", "add", "check_model",
           "remove"]
