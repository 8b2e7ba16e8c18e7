"""How a model's module tree is read into a :class:`~attnft.roles.map.RoleMap` (:func:`build_role_map`).

Roles are assigned by walking the module tree from the root. The outermost module that claims a role (an
attention module, an FFN module, the patch embedding, the classifier head) gives that role to every
parameter below it; outside claimed modules a parameter's own kind decides (norm, layer scale, position
embedding, tokens), and anything left is ``other``. What a library calls its modules comes from its family
table (:mod:`attnft.roles.families`); unknown classes fall back to their name. Fused parallel blocks get
one entry per role of a shared weight, each owning a contiguous range of it.
"""
from __future__ import annotations

import re
from typing import Optional

from torch import nn

from .families import Family, backbone_of, family_of
from .map import ModuleRecord, Region, Role, RoleEntry, RoleMap
from .names import is_method_tensor, split_first

# torch has nn.RMSNorm from 2.4 on; attnft allows 2.1
_NORM_CLASSES = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())

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
    found = ModuleRecord(backbone=backbone_of(model, family))
    found.roles[""] = None

    def walk(module: nn.Module, prefix: str, role: Optional[Role], block: Optional[int], top_level: bool) -> None:
        for pname, param in module.named_parameters(recurse=False):
            if is_method_tensor(prefix + pname):
                continue  # an adaptation method's, not the base's (the role map is the base's)
            own = role if role is not None else _own_param_role(family, module, pname)
            entries.append(RoleEntry(prefix + pname, own, block, tuple(param.shape)))
        for tname in [*module._parameters, *module._buffers]:
            if tname in family.grid_tensors:
                found.grid[prefix + tname] = family.grid_tensors[tname]
        for attr, child in module.named_children():
            path = prefix + attr
            if is_method_tensor(path):
                continue  # a module an adaptation method added
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
