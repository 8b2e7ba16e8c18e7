"""The role map: which weight of a model is attention, FFN, norm, ... and in which block.

This package is the single source of truth for "which weights are attention", and the only
reader of parameter and module names in attnft: policies, adapters, multi-task serving,
memory options, resolution and peft targets ask a :class:`RoleMap` (which module has which
role, which module is block ``i``, which tensors are biases, heads or grid-sized) or the name
helpers of :mod:`attnft.roles.names`. What a library calls its modules lives in one table per
family (:mod:`attnft.roles.families`: timm, transformers); :mod:`attnft.roles.walk` reads a model's
module tree with them into a :class:`RoleMap` (:func:`~attnft.roles.walk.build_role_map`).

Roles are assigned by walking the module tree from the root. The outermost module that
claims a role (an attention module, an FFN module, the patch embedding, the classifier head)
gives that role to every parameter below it, so ``attn.rel_pos.mlp.fc1`` is attention and
``attn_pool.mlp.fc1`` is head. Outside claimed modules, a parameter's own kind decides (norm,
layer scale, position embedding, tokens) and anything left is ``other``.

Fused parallel blocks (timm's ``ParallelScalingBlock``) hold attention and FFN in one
weight; those tensors get one entry per role, each owning a contiguous range of rows
(``in_proj``: [mlp | q | k | v]) or columns (fused ``out_proj``: [attn | mlp]).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Iterator, Optional

import torch
from torch import nn

from .names import is_bias, join_name, module_of, split_first

class Role(str, Enum):
    ATTENTION = "attention"
    FFN = "ffn"
    NORM = "norm"
    LAYER_SCALE = "layer_scale"
    PATCH_EMBED = "patch_embed"
    POS_EMBED = "pos_embed"
    TOKENS = "tokens"
    HEAD = "head"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


ROLE_ALIASES = {"attn": Role.ATTENTION, "mhsa": Role.ATTENTION, "mlp": Role.FFN, "ls": Role.LAYER_SCALE}


def parse_role(text: str) -> Role:
    """A role from its name or alias (``attn`` -> attention, ``mlp`` -> ffn)."""
    key = text.strip().lower()
    if key in ROLE_ALIASES:
        return ROLE_ALIASES[key]
    return Role(key)  # ValueError for unknown names; callers turn it into a user error


@dataclass(frozen=True)
class Region:
    """A contiguous range ``[start, stop)`` of a tensor along ``dim`` (0 = rows, 1 = columns)."""

    dim: int
    start: int
    stop: int

    def index(self, ndim: int) -> tuple:
        """Index tuple selecting this region of a tensor with ``ndim`` dims."""
        return (slice(None),) * self.dim + (slice(self.start, self.stop),) + (slice(None),) * (ndim - self.dim - 1)

    def numel(self, shape: torch.Size) -> int:
        n = self.stop - self.start
        for d, size in enumerate(shape):
            if d != self.dim:
                n *= size
        return n


@dataclass(frozen=True)
class RoleEntry:
    """One role owning a parameter, or a region of it for fused weights."""

    name: str  # as in model.named_parameters()
    role: Role
    block: Optional[int]  # transformer block index in forward order; None outside blocks
    shape: tuple
    region: Optional[Region] = None  # None: the whole tensor

    @property
    def is_bias(self) -> bool:
        return is_bias(self.name)

    @property
    def numel(self) -> int:
        if self.region is None:
            n = 1
            for s in self.shape:
                n *= s
            return n
        return self.region.numel(torch.Size(self.shape))


@dataclass
class ModuleRecord:
    """What the walk learns about modules, by module path ('' is the root)."""

    roles: dict[str, Optional[Role]] = field(default_factory=dict)  # None: the module claims nothing
    claimed_by: dict[str, str] = field(default_factory=dict)  # module -> the outermost module claiming its role
    block_of: dict[str, int] = field(default_factory=dict)
    blocks: list[str] = field(default_factory=list)  # block index -> module path
    heads: list[str] = field(default_factory=list)  # top-level head modules, module order
    grid: dict[str, str] = field(default_factory=dict)  # grid-sized parameter or buffer -> its layout
    backbone: Optional[str] = None  # transformers' base model attribute ('vit'); None for timm


class RoleMap:
    """Roles of every parameter of a model, in ``named_parameters()`` order, and what its modules are."""

    def __init__(self, entries: list[RoleEntry], num_blocks: int, model_name: str = "",
                 modules: Optional[ModuleRecord] = None):
        self.entries = entries
        self.num_blocks = num_blocks
        self.model_name = model_name
        self._modules = modules or ModuleRecord()
        self._by_name: dict[str, list[RoleEntry]] = {}
        for e in entries:
            self._by_name.setdefault(e.name, []).append(e)

    def with_new_head(self, model: nn.Module) -> RoleMap:
        """This map of ``model`` after its ``reset_classifier``: the head's tensors re-read (new shapes, or new
        tensors where the head was a parameter-free ``nn.Identity``), every other entry as it was; no second walk.

        ValueError for a tensor that is new outside the head: the model changed more than its classifier.
        """
        entries = []
        for name, param in model.named_parameters():
            if name in self._by_name:
                entries.extend(replace(e, shape=tuple(param.shape)) for e in self._by_name[name])
            elif self.is_head(name):
                entries.append(RoleEntry(name, Role.HEAD, None, tuple(param.shape)))
            else:
                raise ValueError(f"{name} is new and outside the head of {self.model_name}: build the role map again")
        return RoleMap(entries, self.num_blocks, self.model_name, self._modules)

    def __iter__(self) -> Iterator[RoleEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def of(self, name: str) -> list[RoleEntry]:
        """The entries of one parameter (two for a fused weight split between roles)."""
        return self._by_name[name]

    def names(self) -> list[str]:
        return list(self._by_name)

    def is_split(self, name: str) -> bool:
        return len(self._by_name[name]) > 1

    def names_with_role(self, role: Role) -> list[str]:
        """Parameters owned, wholly or in part, by ``role``."""
        return [n for n, es in self._by_name.items() if any(e.role == role for e in es)]

    def modules_with_role(self, model: nn.Module, role: Role) -> list[str]:
        """Names of leaf modules all of whose parameters have ``role`` and none of them split.

        This is what adapter methods that wrap modules (LoRA, IA3) may target.
        """
        names = []
        for mod_name, module in model.named_modules():
            params = [join_name(mod_name, p) for p, _ in module.named_parameters(recurse=False)]
            if not params or any(True for _ in module.children()):
                continue
            if all(not self.is_split(p) and self.of(p)[0].role == role for p in params):
                names.append(mod_name)
        return names

    # --- modules ---------------------------------------------------------------------------

    def module_role(self, path: str) -> Optional[Role]:
        """The role a module has (claimed by it or by a module above it); None for containers that
        claim nothing (blocks, stages, the root) and for modules the map does not know."""
        return self._modules.roles.get(path)

    def outermost_modules(self, role: Role) -> list[str]:
        """The modules that give ``role`` to everything below them, outermost only, in module order
        (``blocks.0.attn``, ``blocks.0.mlp``; every norm outside other claims for ``Role.NORM``)."""
        return [path for path, owner in self._modules.claimed_by.items()
                if owner == path and self._modules.roles[path] == role]

    def claiming_module(self, name: str) -> Optional[str]:
        """The outermost module whose claim gave parameter ``name`` its role ('blocks.0.attn' for
        'blocks.0.attn.qkv.weight'); None for a tensor whose own kind decides (``pos_embed``)."""
        return self._modules.claimed_by.get(module_of(name))

    def block_path(self, index: int) -> str:
        """The module path of block ``index`` ('blocks.3', 'layers.1.blocks.0', 'vit.layers.3')."""
        return self._modules.blocks[index]

    def block_paths(self) -> list[str]:
        return list(self._modules.blocks)

    def block_of_module(self, path: str) -> Optional[int]:
        """The index of the block holding module ``path`` (the block itself included); None outside blocks."""
        return self._modules.block_of.get(path)

    def head_modules(self) -> list[str]:
        """The top-level head modules ('head', 'head_dist', 'fc_norm'; 'classifier'), parameter-free
        ones (``nn.Identity`` of a model built with ``num_classes=0``) included."""
        return list(self._modules.heads)

    def head_of(self, name: str) -> Optional[str]:
        """The head module holding tensor ``name`` (a parameter, a buffer or a key the model lacks,
        e.g. a new classifier's), or None."""
        return next((h for h in self._modules.heads if name == h or name.startswith(h + ".")), None)

    def is_head(self, name: str) -> bool:
        return self.head_of(name) is not None

    def is_bias(self, name: str) -> bool:
        return is_bias(name)

    def grid_tensors(self) -> dict[str, str]:
        """Parameters and buffers whose size follows the input grid or window -> their layout
        (``abs_pos_embed``, ``rel_pos_bias_table``, ``decomposed_rel_pos``; see :class:`attnft.roles.families.Family`)."""
        return dict(self._modules.grid)

    def is_grid_sized(self, name: str) -> bool:
        return name in self._modules.grid

    def top_level(self, name: str) -> str:
        """The top-level module or tensor holding ``name`` ('head' for 'head.fc.weight', 'pos_embed');
        in a model with a backbone attribute, one level below it ('vit.embeddings')."""
        top, rest = split_first(name)
        if top == self._modules.backbone and rest:
            return join_name(top, split_first(rest)[0])
        return top
