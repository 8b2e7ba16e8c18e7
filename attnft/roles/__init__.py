"""The models' anatomy: which weight of a model is what (attention, FFN, head, position tables, ...).

:mod:`.map` is the role map, the only reader of parameter and module names; :mod:`.families` holds one
table per library and family it reads them with. Everything above asks a :class:`RoleMap`.
"""
from .map import (
    Region,
    Role,
    RoleEntry,
    RoleMap,
    build_role_map,
    is_bias,
    is_peft_tensor,
    is_under,
    is_weight,
    join_name,
    module_of,
    parse_role,
    split_first,
    split_last,
)

__all__ = ["Region", "Role", "RoleEntry", "RoleMap", "build_role_map", "is_bias", "is_peft_tensor", "is_under",
           "is_weight", "join_name", "module_of", "parse_role", "split_first", "split_last"]
