"""The role map: which weight of a model is attention, FFN, norm, ... and in which block.

This module is the single source of truth for "which weights are attention", and the only
reader of parameter and module names in attnft: policies, adapters, multi-task serving,
memory options, resolution and peft targets ask a :class:`RoleMap` (which module has which
role, which module is block ``i``, which tensors are biases, heads or grid-sized) or the name
helpers at the end of this module. What a library calls its modules lives in one table per
family (:mod:`attnft.roles.families`: timm, transformers).

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

import re
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterator, Optional

import torch
from torch import nn

from .families import Family, backbone_of, family_of

# torch has nn.RMSNorm from 2.4 on; attnft allows 2.1
_NORM_CLASSES = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


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
class _Modules:
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
                 modules: Optional[_Modules] = None):
        self.entries = entries
        self.num_blocks = num_blocks
        self.model_name = model_name
        self._modules = modules or _Modules()
        self._by_name: dict[str, list[RoleEntry]] = {}
        for e in entries:
            self._by_name.setdefault(e.name, []).append(e)

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

    def numel_by_role(self) -> dict[Role, int]:
        counts: Counter = Counter()
        for e in self.entries:
            counts[e.role] += e.numel
        return {role: counts.get(role, 0) for role in Role}

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


# --- what claims a role ------------------------------------------------------------------

# Unknown classes fall back to their name so a new family is still mostly right.
_ATTENTION_LIKE = re.compile(r"Attention|Attn")
_FFN_LIKE = re.compile(r"Mlp|MLP|SwiGLU|FeedForward|Ffn")
_NOT_ATTENTION = re.compile(r"Pool(Latent|2d|Prr)|Block|Stage")


def _class_name(module: nn.Module) -> str:
    return type(module).__name__


def is_attention_module(module: nn.Module, family: Optional[Family] = None) -> bool:
    name = _class_name(module)
    if name in (family or family_of(module)).attention:
        return True
    return bool(_ATTENTION_LIKE.search(name)) and not _NOT_ATTENTION.search(name)


def is_ffn_module(module: nn.Module, family: Optional[Family] = None) -> bool:
    name = _class_name(module)
    return name in (family or family_of(module)).ffn or (bool(_FFN_LIKE.search(name)) and not _NOT_ATTENTION.search(name))


def is_norm_module(module: nn.Module, family: Optional[Family] = None) -> bool:
    if isinstance(module, _NORM_CLASSES):
        return True
    return "Norm" in _class_name(module) and not is_ffn_module(module, family)


def is_layer_scale_module(module: nn.Module, family: Optional[Family] = None) -> bool:
    family = family or family_of(module)
    name = _class_name(module)
    return name in family.layer_scale_modules or (name.startswith(family.layer_scale_prefix) and not name.endswith("Block"))


def _claim(family: Family, module: nn.Module, attr: str, top_level: bool) -> Optional[Role]:
    """The role a module claims for everything below it, or None."""
    name = _class_name(module)
    if top_level and attr in family.heads:
        return Role.HEAD
    if (top_level and attr in family.top_level_patch_embed) or attr in family.patch_embed_attrs \
            or name in family.patch_embed:
        return Role.PATCH_EMBED
    if name in family.pos_embed_modules or attr in family.pos_embed_attrs:
        return Role.POS_EMBED
    if is_attention_module(module, family):
        return Role.ATTENTION
    if is_ffn_module(module, family):
        return Role.FFN
    return None


def _is_block(family: Family, module: nn.Module) -> bool:
    """A transformer block: a class the family lists, or a ``*Block*`` module holding attention."""
    name = _class_name(module)
    if name in family.blocks or name in family.fused_blocks:
        return True
    # "Block" anywhere: CaiT's class-attention block is LayerScaleBlockClassAttn
    return "Block" in name and any(is_attention_module(m, family) for m in module.modules() if m is not module)


def _own_param_role(family: Family, module: nn.Module, param_name: str) -> Role:
    """Role of a parameter registered directly on an unclaimed module."""
    if family.pos_embed_names.match(param_name):
        return Role.POS_EMBED
    if param_name in family.token_names:
        return Role.TOKENS
    if family.layer_scale_names.match(param_name) or is_layer_scale_module(module, family):
        return Role.LAYER_SCALE
    if is_norm_module(module, family):
        return Role.NORM
    return Role.OTHER


def _fused_block_entries(block: nn.Module, prefix: str, index: int) -> list[RoleEntry]:
    """Entries of a ParallelScalingBlock: attention and MLP share ``in_proj`` (and maybe ``out_proj``)."""
    mlp_hidden = block.in_split[0]
    dim = block.in_split[1]
    entries = []
    for name, param in block.named_parameters():
        full = f"{prefix}{name}"
        shape = tuple(param.shape)
        if name.startswith("in_proj."):
            # rows are [mlp | q | k | v], for weight and bias alike
            rows = param.shape[0]
            entries.append(RoleEntry(full, Role.FFN, index, shape, Region(0, 0, mlp_hidden)))
            entries.append(RoleEntry(full, Role.ATTENTION, index, shape, Region(0, mlp_hidden, rows)))
        elif name == "out_proj.weight":
            # columns are [attn | mlp]: the input is cat(x_attn, x_mlp)
            cols = param.shape[1]
            entries.append(RoleEntry(full, Role.ATTENTION, index, shape, Region(1, 0, dim)))
            entries.append(RoleEntry(full, Role.FFN, index, shape, Region(1, dim, cols)))
        elif name == "out_proj.bias":
            # one bias for the summed branches; we count it with the attention projection
            entries.append(RoleEntry(full, Role.ATTENTION, index, shape))
        else:
            head = split_first(name)[0]
            if head in ("mlp_bias", "mlp_out_proj"):
                role = Role.FFN
            elif head == "in_norm":
                role = Role.NORM
            elif head == "ls":
                role = Role.LAYER_SCALE
            else:  # q_norm, k_norm, attn_out_proj, sub_norm, lambda_*
                role = Role.ATTENTION
            entries.append(RoleEntry(full, role, index, shape))
    return entries


def build_role_map(model: nn.Module) -> RoleMap:
    """Give every parameter of ``model`` its role(s) and block index, and record its modules."""
    family = family_of(model)
    entries: list[RoleEntry] = []
    found = _Modules(backbone=backbone_of(model, family))
    found.roles[""] = None

    def walk(module: nn.Module, prefix: str, role: Optional[Role], block: Optional[int], top_level: bool) -> None:
        for pname, param in module.named_parameters(recurse=False):
            own = role if role is not None else _own_param_role(family, module, pname)
            entries.append(RoleEntry(prefix + pname, own, block, tuple(param.shape)))
        for tname in [*module._parameters, *module._buffers]:
            if tname in family.grid_tensors:
                found.grid[prefix + tname] = family.grid_tensors[tname]
        for attr, child in module.named_children():
            path = prefix + attr
            child_block = block
            if role is None and block is None and _is_block(family, child):
                child_block = len(found.blocks)
                found.blocks.append(path)
                if _class_name(child) in family.fused_blocks:
                    found.roles[path], found.block_of[path] = None, child_block
                    entries.extend(_fused_block_entries(child, path + ".", child_block))
                    continue
            child_role = role if role is not None else _claim(family, child, attr, top_level)
            if child_role is None and is_norm_module(child, family):
                if top_level and attr in family.heads:
                    child_role = Role.HEAD
                elif _class_name(module) in family.embedding_classes:
                    child_role = Role.PATCH_EMBED
                else:
                    child_role = Role.NORM
            found.roles[path] = child_role
            if child_role is not None:
                found.claimed_by[path] = found.claimed_by.get(prefix[:-1], path) if role is not None else path
                if child_role == Role.HEAD and role is None:
                    found.heads.append(path)
            if child_block is not None:
                found.block_of[path] = child_block
            # a transformers backbone's children are top level too: its pooler is a head
            walk(child, path + ".", child_role, child_block, top_level=top_level and path == found.backbone)

    walk(model, "", None, None, top_level=True)
    # named_parameters() order, so reports and adapters list tensors as the model does
    # (a parameter shared by two modules appears once, under its first name, as there)
    order = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    entries = sorted((e for e in entries if e.name in order), key=lambda e: order[e.name])
    name = getattr(model, "default_cfg", {}).get("architecture", type(model).__name__)
    return RoleMap(entries, len(found.blocks), name, found)


# --- names ---------------------------------------------------------------------------------
# The rest of attnft reads parameter and module names only through these.


def split_first(name: str) -> tuple[str, str]:
    """'blocks.0.attn' -> ('blocks', '0.attn'); 'pos_embed' -> ('pos_embed', '')."""
    first, _, rest = name.partition(".")
    return first, rest


def split_last(name: str) -> tuple[str, str]:
    """'blocks.0.attn.qkv.weight' -> ('blocks.0.attn.qkv', 'weight'); a root tensor's module is ''."""
    owner, _, leaf = name.rpartition(".")
    return owner, leaf


def module_of(name: str) -> str:
    """The path of the module holding parameter or buffer ``name`` ('' for the root)."""
    return split_last(name)[0]


def join_name(module_path: str, name: str) -> str:
    """A name under a module: join_name('blocks.0', 'attn') == 'blocks.0.attn'; the root's path is ''."""
    return f"{module_path}.{name}" if module_path else name


def is_under(name: str, module_path: str) -> bool:
    """Whether ``name`` is ``module_path`` or lies inside it."""
    return name == module_path or name.startswith(module_path + ".")


def is_bias(name: str) -> bool:
    """A bias tensor: bias, q_bias, v_bias, mlp_bias, qkv_bias."""
    return split_last(name)[1].endswith("bias")


def is_weight(name: str) -> bool:
    """A weight tensor ('head.weight', 'fc1_g.weight'), as opposed to a bias, a scale or a token."""
    return split_last(name)[1].endswith("weight")


# peft's additions to a module's state dict: its method's tensors, and for a module it trains
# whole (the head) the trained copy; ``original_module`` is the base's own copy and counts
_PEFT_TENSOR = re.compile(r"(^|\.)(lora_[A-Za-z_]+|ia3_l|modules_to_save|lora_magnitude_vector)(\.|$)")


def is_peft_tensor(key: str) -> bool:
    """Whether state-dict ``key`` is a tensor peft added (LoRA / IA3 weights, a trained head's copy)."""
    return _PEFT_TENSOR.search(key) is not None
