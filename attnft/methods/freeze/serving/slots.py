"""Where a served task's own state lives in the base model: one slot per module or tensor.

The role map says which parameters are attention, head, position embedding or tokens; a
slot is the place a task substitutes its values: the outermost attention module holding
a parameter, the top-level head module, or the bare tensor (``pos_embed``, ``cls_token``).
Everything outside the slots (patch embedding, FFN, norms, layer scale) is shared by every
task and runs once per batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from torch import nn

from ....core.errors import AdapterError, ConfigError, NoAttentionError
from ....roles import Role, RoleMap, split_last


class SlotKind(str, Enum):
    """How a slot behaves in a batch that mixes tasks."""

    # attention module inside a block: runs once per task group on that group's rows
    BLOCK_ATTENTION = "block_attention"
    # attention module outside the blocks whose output every block reads (a shared relative
    # position table): computed once per task, each block picks its group's value
    SHARED_ATTENTION = "shared_attention"
    # module computing the position embedding of the whole batch (XCiT): one row per sample
    POS_EMBED_MODULE = "pos_embed_module"
    # position embedding or token tensor with a leading size-1 batch dim: expanded per sample
    SAMPLE_TENSOR = "sample_tensor"
    # classifier modules and tensors: run once per task group on that group's features
    HEAD = "head"


SERVED_ROLES = frozenset({Role.ATTENTION, Role.HEAD, Role.POS_EMBED, Role.TOKENS})


@dataclass(frozen=True)
class Slot:
    """A module or a tensor of the base model that each task may replace."""

    path: str  # module path ('blocks.0.attn') or parameter name ('pos_embed')
    kind: SlotKind
    is_tensor: bool  # True: a bare parameter on its owner module; False: a whole module

    @property
    def owner(self) -> str:
        """Path of the module holding this slot as an attribute ('' = the root)."""
        return split_last(self.path)[0]

    @property
    def attr(self) -> str:
        return split_last(self.path)[1]

    def relative(self, param_name: str) -> str:
        """A parameter's name inside this slot's module ('' for a tensor slot)."""
        return "" if self.is_tensor else param_name[len(self.path) + 1:]


class SlotMap:
    """Every slot of a model and the slot of each servable parameter."""

    def __init__(self, slots: list[Slot], by_param: dict[str, Slot], empty_heads: dict[str, Slot]):
        self.slots = slots + list(empty_heads.values())
        self.by_param = by_param
        self.empty_heads = empty_heads  # top-level nn.Identity heads (num_classes=0): tasks bring a Linear

    def __iter__(self):
        return iter(self.slots)

    def of(self, param_name: str, role_map: RoleMap) -> Slot:
        """The slot of ``param_name``; AdapterError for a weight every task must share."""
        if param_name in self.by_param:
            return self.by_param[param_name]
        head = role_map.head_of(param_name)
        if head in self.empty_heads:
            return self.empty_heads[head]  # a classifier the base was built without
        if param_name not in role_map.names():
            raise AdapterError(f"{param_name} is not a parameter of the base model {role_map.model_name}")
        role = role_map.of(param_name)[0].role
        raise AdapterError(
            f"{param_name} is a {role.value} weight, which every served task shares: multi-task serving takes "
            "adapters that train only attention, position embedding, tokens and head (policy 'attn')"
        )


def find_slots(model: nn.Module, role_map: RoleMap) -> SlotMap:
    """The slots of ``model``; ConfigError for families whose attention cannot be swapped alone."""
    attention = role_map.names_with_role(Role.ATTENTION)
    if not attention:
        raise NoAttentionError(f"{role_map.model_name} has no attention weights to serve per task")
    fused = [name for name in attention if role_map.is_split(name)]
    if fused:
        raise ConfigError(
            f"{role_map.model_name} fuses attention and FFN in one weight ({fused[0]}, a ParallelScalingBlock): "
            "the FFN cannot be shared while attention changes per task, so it cannot serve several tasks"
        )
    slots: dict[str, Slot] = {}
    by_param: dict[str, Slot] = {}
    for name in role_map.names():
        entry = role_map.of(name)[0]
        if entry.role not in SERVED_ROLES:
            continue
        slot = _slot_of(role_map, name, entry.role, entry.block)
        slots.setdefault(slot.path, slot)
        by_param[name] = slots[slot.path]
    empty_heads = {
        path: Slot(path, SlotKind.HEAD, False)
        for path in role_map.head_modules()
        if isinstance(model.get_submodule(path), nn.Identity)
    }
    return SlotMap(list(slots.values()), by_param, empty_heads)


def _slot_of(role_map: RoleMap, name: str, role: Role, block: Optional[int]) -> Slot:
    owner = role_map.claiming_module(name)  # the outermost module whose class gave the role
    if role == Role.ATTENTION:
        if owner is None:
            raise ConfigError(f"{role_map.model_name}: attention weight {name} is not inside an attention module")
        return Slot(owner, SlotKind.BLOCK_ATTENTION if block is not None else SlotKind.SHARED_ATTENTION, False)
    if role == Role.HEAD:
        # heads are top-level modules (head, head_dist, attn_pool, fc_norm)
        return Slot(owner or name, SlotKind.HEAD, owner is None)
    if owner is not None:  # a module computing the position embedding (XCiT)
        return Slot(owner, SlotKind.POS_EMBED_MODULE, False)
    return Slot(name, SlotKind.SAMPLE_TENSOR, True)
