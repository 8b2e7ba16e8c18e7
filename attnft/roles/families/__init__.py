"""Model families: the tables that tell the role map what a library's modules and tensors are.

A family is data, not code: the class names of its attention, FFN, patch-embedding and block
modules, the attribute names of its heads, and the names of its position embeddings, tokens,
layer scales and grid-sized tensors. :mod:`attnft.roles` walks any model with the table of its
family; to support a new library, add one :class:`Family` to :data:`FAMILIES`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from torch import nn

@dataclass(frozen=True)
class Family:
    """What a library calls the parts of a Vision Transformer. Class names are matched exactly,
    so a family's modules need not be imported."""

    name: str
    module_prefix: str  # a model belongs to the family when its class's module starts with this
    attention: frozenset[str]  # attention modules (relative-position modules count as attention)
    ffn: frozenset[str]
    patch_embed: frozenset[str]
    blocks: frozenset[str]  # transformer blocks (a class with "Block" in its name holding attention is one too)
    heads: frozenset[str]  # attribute names of the head modules at the top level
    pos_embed_names: re.Pattern  # tensors registered directly on an unclaimed module
    token_names: frozenset[str]
    layer_scale_names: re.Pattern
    # leaf name of a tensor whose size follows the input grid or window -> its layout:
    # "abs_pos_embed" (1, prefix + H*W, C), "rel_pos_bias_table" ((2Wh-1)*(2Ww-1) + extra, heads),
    # "decomposed_rel_pos" (2L-1, head_dim)
    grid_tensors: Mapping[str, str]
    fused_blocks: frozenset[str] = frozenset()  # attention and FFN in one weight (see roles.py)
    pos_embed_modules: frozenset[str] = frozenset()
    layer_scale_modules: frozenset[str] = frozenset()
    top_level_patch_embed: frozenset[str] = frozenset()  # attribute names, at the top level only
    patch_embed_attrs: frozenset[str] = frozenset()  # attribute names, at any depth
    pos_embed_attrs: frozenset[str] = frozenset()  # attribute names of position-embedding modules, at any depth
    embedding_classes: frozenset[str] = frozenset()  # containers whose norms belong to the patch embedding
    # the root's attribute that names its backbone attribute (transformers' ``base_model_prefix``):
    # the backbone's children count as top level too, so its pooler is a head
    backbone_attribute: Optional[str] = None
    layer_scale_prefix: str = "\0"  # classes starting with it are layer scales


from .timm import TIMM  # noqa: E402  (the tables need Family)
from .transformers import TRANSFORMERS  # noqa: E402

# checked in order; the last matches every model, so models of unknown libraries are read as timm's
FAMILIES: tuple[Family, ...] = (TRANSFORMERS, TIMM)


def family_of(module: nn.Module) -> Family:
    """The family whose table describes ``module``'s class."""
    where = type(module).__module__
    return next(f for f in FAMILIES if where.startswith(f.module_prefix))


def backbone_of(model: nn.Module, family: Family) -> Optional[str]:
    """The attribute holding ``model``'s backbone (transformers' ``vit``, ``swin``, ...), or None."""
    if family.backbone_attribute is None:
        return None
    name = getattr(model, family.backbone_attribute, None)
    return name if isinstance(name, str) and isinstance(getattr(model, name, None), nn.Module) else None
