"""Where a peft method goes: the role map's modules of the adapted roles, by exact name.

peft matches ``target_modules`` as names or dotted suffixes, so a bare ``proj`` also wraps
``patch_embed.proj``; here every target is a full module name the role map chose, checked
against what peft really wrapped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import ModulesToSaveWrapper
from torch import nn

from ...roles import Role, RoleMap, join_name
from .spec import PeftPolicy


@dataclass
class PeftTargets:
    """Exact module names a policy adapts, the head modules trained whole, and what stays frozen."""

    modules: dict[str, Role]  # module name -> role, in model order
    head: list[str]  # modules_to_save
    untargeted: list[str]  # parameters of the adapted roles that no module of the method can hold

    @property
    def feedforward(self) -> list[str]:
        return [name for name, role in self.modules.items() if role == Role.FFN]


def select_targets(model: nn.Module, policy: PeftPolicy, role_map: RoleMap) -> PeftTargets:
    """The role map's modules of ``policy.roles`` that ``policy.method`` can wrap, by full name."""
    modules = dict(model.named_modules())
    chosen: dict[str, Role] = {}
    for role in policy.roles:
        for name in role_map.modules_with_role(model, role):
            if not policy.peft_method.can_wrap(modules[name]):
                continue
            block = _module_block(modules[name], name, role_map)
            if block is not None and policy.blocks is not None and block not in policy.blocks:
                continue
            chosen[name] = role
    order = {name: i for i, name in enumerate(modules)}
    chosen = dict(sorted(chosen.items(), key=lambda item: order[item[0]]))
    held = {join_name(name, p) for name in chosen for p, _ in modules[name].named_parameters()}
    # of the blocks asked for: a tensor @BLOCKS leaves out is not one the method failed to wrap
    asked = [n for role in policy.roles for n in role_map.names_with_role(role)
             if policy.blocks is None or role_map.of(n)[0].block in policy.blocks | {None}]
    untargeted = list(dict.fromkeys(n for n in asked if n not in held))
    head = modules_to_save(model, role_map) if policy.head else []
    return PeftTargets(chosen, head, untargeted)


def _module_block(module: nn.Module, name: str, role_map: RoleMap) -> Optional[int]:
    # the block of its first parameter: RoleMap.block_of_module does not see inside fused blocks
    first = next(p for p, _ in module.named_parameters())
    return role_map.of(join_name(name, first))[0].block


def modules_to_save(model: nn.Module, role_map: RoleMap) -> list[str]:
    """The fewest, smallest modules that hold every HEAD parameter (``head``, ``head.fc``, ``fc_norm``, ``attn_pool``).

    A module is taken whole when it holds parameters itself (``attn_pool.latent``) or has no
    children; otherwise its children are taken, so ``head.fc`` rather than timm's
    ``ClassifierHead`` (peft's mixed-task batches need a plain Linear there).
    """
    head_params = set(role_map.names_with_role(Role.HEAD))
    chosen: list[str] = []

    def visit(module: nn.Module, path: str) -> None:
        names = {join_name(path, p) for p, _ in module.named_parameters()}
        if not names or not names & head_params:
            return
        own = list(module.named_parameters(recurse=False))
        if names <= head_params and path and (own or not list(module.children())):
            chosen.append(path)
            return
        for attr, child in module.named_children():
            visit(child, join_name(path, attr))

    visit(model, "")
    return chosen


def adapted_modules(peft_model: PeftModel) -> dict[str, str]:
    """What peft actually changed, by base-model module name: ``"adapter"`` (a tuner layer) or ``"head"`` (a trained copy)."""
    found = {}
    for name, module in peft_model.get_base_model().named_modules():
        if isinstance(module, BaseTunerLayer):
            found[name] = "adapter"
        elif isinstance(module, ModulesToSaveWrapper):
            found[name] = "head"
    return found


def check_injection(peft_model: PeftModel, targets: PeftTargets) -> None:
    """peft matches list entries as exact names or dotted suffixes: make sure nothing else was caught."""
    found = adapted_modules(peft_model)
    expected = {**{n: "adapter" for n in targets.modules}, **{n: "head" for n in targets.head}}
    if found != expected:
        extra = sorted(set(found.items()) - set(expected.items()))
        missing = sorted(set(expected.items()) - set(found.items()))
        raise RuntimeError(f"peft adapted other modules than the role map chose: extra {extra}, missing {missing}")


def peft_target_modules(model: nn.Module, names: list[str]) -> Union[list[str], str]:
    """``target_modules`` that match exactly ``names``.

    peft matches a list entry against a module's full name or any name ending in ``.entry``;
    a list of full names is exact unless another module's name ends with one of them (a
    nested copy of the same path), in which case an anchored regex is used.
    """
    # peft's own rule, not a role: a list entry also catches any module whose name ends in ".entry"
    if any(other.endswith("." + name) for other, _ in model.named_modules() for name in names):
        return "|".join(re.escape(n) for n in names)  # peft uses re.fullmatch for a string
    return list(names)
