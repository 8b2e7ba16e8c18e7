"""The models' anatomy: which weight of a model is what (attention, FFN, head, position tables, ...).

:mod:`.map` is the role map (what each weight and module is), :mod:`.walk` builds it from a model's module
tree, :mod:`.names` holds the name helpers; with :mod:`.families` (one table per library and family) they are
the only readers of parameter and module names. Everything above asks a :class:`RoleMap`.
"""
from .map import Region, Role, RoleEntry, RoleMap, parse_role
from .names import (is_bias, is_method_tensor, is_under, is_weight, join_name, module_of, register_tensor_prefixes,
                    split_first, split_last, tensor_prefix_owner)
from .walk import build_role_map

__all__ = ["Region", "Role", "RoleEntry", "RoleMap", "build_role_map", "is_bias", "is_method_tensor", "is_under",
           "is_weight", "join_name", "module_of", "parse_role", "register_tensor_prefixes", "split_first", "split_last",
           "tensor_prefix_owner"]
