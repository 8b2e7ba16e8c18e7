"""The role map: which weight of a timm model is attention, FFN, norm, ... and in which block.

This module is the single source of truth for "which weights are attention". Every other
part of attnft (policies, adapters, multi-task serving, peft targets) asks it; nothing else
matches parameter names.

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
from dataclasses import dataclass
from enum import Enum
from typing import Iterator, Optional

import torch
from torch import nn


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
    def numel(self) -> int:
        if self.region is None:
            n = 1
            for s in self.shape:
                n *= s
            return n
        return self.region.numel(torch.Size(self.shape))


class RoleMap:
    """Roles of every parameter of a model, in ``named_parameters()`` order."""

    def __init__(self, entries: list[RoleEntry], num_blocks: int, model_name: str = ""):
        self.entries = entries
        self.num_blocks = num_blocks
        self.model_name = model_name
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
            params = [f"{mod_name}.{p}" if mod_name else p for p, _ in module.named_parameters(recurse=False)]
            if not params or any(True for _ in module.children()):
                continue
            if all(not self.is_split(p) and self.of(p)[0].role == role for p in params):
                names.append(mod_name)
        return names


# --- what claims a role ------------------------------------------------------------------

# Known timm attention classes (every family attnft supports), checked by class name so that
# a family's module need not be imported. Relative-position modules belong to attention.
ATTENTION_CLASSES = {
    "Attention",  # vit, deit, pvt_v2, beit, timm.layers
    "AttentionRope",
    "EvaAttention",
    "ClassAttn",  # cait, xcit class-attention
    "TalkingHeadAttn",  # cait
    "WindowAttention",  # swin v1 and v2
    "XCA",  # xcit cross-covariance attention
    "MultiScaleAttention",  # mvitv2
    "MultiScaleAttentionPoolFirst",
    "MaskUnitAttention",  # hiera
    "RelPosAttention",  # vit_relpos
    "DiffAttention",
    "RelativePositionBias",  # beit shared relative position bias
    "RelPosBias",
    "RelPosMlp",
    "RelPosBiasTf",
}
FFN_CLASSES = {"Mlp", "GluMlp", "SwiGLU", "SwiGLUPacked", "GatedMlp", "ConvMlp", "MlpWithDepthwiseConv", "GlobalResponseNormMlp"}
PATCH_EMBED_CLASSES = {"PatchEmbed", "HybridEmbed", "ConvPatchEmbed", "OverlapPatchEmbed", "PatchEmbedWithSize"}
FUSED_BLOCK_CLASSES = {"ParallelScalingBlock", "DiffParallelScalingBlock"}
HEAD_NAMES = {"head", "head_dist", "attn_pool", "fc_norm", "head_drop", "pre_logits"}  # top-level attributes
POS_EMBED_NAMES = re.compile(r"^(pos_embed\w*|absolute_pos_embed)$")
POS_EMBED_CLASSES = {"PositionalEncodingFourier"}  # xcit
TOKEN_NAMES = {"cls_token", "dist_token", "reg_token", "mask_token"}
LAYER_SCALE_NAMES = re.compile(r"^(gamma_?\d|ls\d?_?gamma|gamma)$")

# Unknown classes fall back to their name so a new family is still mostly right.
_ATTENTION_LIKE = re.compile(r"Attention|Attn")
_FFN_LIKE = re.compile(r"Mlp|MLP|SwiGLU|FeedForward|Ffn")
_NOT_ATTENTION = re.compile(r"Pool(Latent|2d|Prr)|Block|Stage")


def _class_name(module: nn.Module) -> str:
    return type(module).__name__


def is_attention_module(module: nn.Module) -> bool:
    name = _class_name(module)
    if name in ATTENTION_CLASSES:
        return True
    return bool(_ATTENTION_LIKE.search(name)) and not _NOT_ATTENTION.search(name)


def is_ffn_module(module: nn.Module) -> bool:
    name = _class_name(module)
    return name in FFN_CLASSES or (bool(_FFN_LIKE.search(name)) and not _NOT_ATTENTION.search(name))


def is_norm_module(module: nn.Module) -> bool:
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.RMSNorm)):
        return True
    return "Norm" in _class_name(module) and not is_ffn_module(module)


def is_layer_scale_module(module: nn.Module) -> bool:
    return _class_name(module).startswith("LayerScale") and not _class_name(module).endswith("Block")


def _claim(module: nn.Module, attr: str, at_root: bool) -> Optional[Role]:
    """The role a module claims for everything below it, or None."""
    if at_root and attr in HEAD_NAMES:
        return Role.HEAD
    if (at_root and attr == "patch_embed") or _class_name(module) in PATCH_EMBED_CLASSES:
        return Role.PATCH_EMBED
    if _class_name(module) in POS_EMBED_CLASSES:
        return Role.POS_EMBED
    if is_attention_module(module):
        return Role.ATTENTION
    if is_ffn_module(module):
        return Role.FFN
    return None


def _is_block(module: nn.Module) -> bool:
    """A transformer block: a ``*Block*`` module holding attention (or a fused parallel block)."""
    name = _class_name(module)
    if name in FUSED_BLOCK_CLASSES:
        return True
    # "Block" anywhere: CaiT's class-attention block is LayerScaleBlockClassAttn
    return "Block" in name and any(is_attention_module(m) for m in module.modules() if m is not module)


def _own_param_role(module: nn.Module, param_name: str) -> Role:
    """Role of a parameter registered directly on an unclaimed module."""
    if POS_EMBED_NAMES.match(param_name):
        return Role.POS_EMBED
    if param_name in TOKEN_NAMES:
        return Role.TOKENS
    if LAYER_SCALE_NAMES.match(param_name) or is_layer_scale_module(module):
        return Role.LAYER_SCALE
    if is_norm_module(module):
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
            head = name.split(".")[0]
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
    """Give every parameter of ``model`` its role(s) and block index."""
    entries: list[RoleEntry] = []
    block_counter = [0]

    def walk(module: nn.Module, prefix: str, role: Optional[Role], block: Optional[int], at_root: bool) -> None:
        for pname, param in module.named_parameters(recurse=False):
            own = role if role is not None else _own_param_role(module, pname)
            entries.append(RoleEntry(prefix + pname, own, block, tuple(param.shape)))
        for attr, child in module.named_children():
            child_prefix = f"{prefix}{attr}."
            child_block = block
            if role is None and block is None and _is_block(child):
                child_block = block_counter[0]
                block_counter[0] += 1
                if _class_name(child) in FUSED_BLOCK_CLASSES:
                    entries.extend(_fused_block_entries(child, child_prefix, child_block))
                    continue
            child_role = role if role is not None else _claim(child, attr, at_root)
            if child_role is None and is_norm_module(child):
                child_role = Role.HEAD if at_root and attr in HEAD_NAMES else Role.NORM
            walk(child, child_prefix, child_role, child_block, at_root=False)

    walk(model, "", None, None, at_root=True)
    # named_parameters() order, so reports and adapters list tensors as the model does
    # (a parameter shared by two modules appears once, under its first name, as there)
    order = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    entries = sorted((e for e in entries if e.name in order), key=lambda e: order[e.name])
    return RoleMap(entries, block_counter[0], getattr(model, "default_cfg", {}).get("architecture", type(model).__name__))
