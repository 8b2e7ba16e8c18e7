"""Applying a peft policy: wrap the role map's modules, report what trains, group it for the optimizer."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar, Optional, Union

import safetensors.torch
import torch
from peft import PeftModel, get_peft_model
from peft.tuners.ia3 import IA3Layer
from peft.utils import get_peft_model_state_dict
from timm.optim import param_groups_weight_decay
from torch import nn

from ..fingerprint import compute_fingerprint
from ...core.errors import AdapterError, NoAttentionError, UnknownPolicyError
from ...core.parsing import short
from ..report import CountedByRole, RoleCount
from ...roles import Role, RoleMap, build_role_map, module_of
from .names import unprefixed
from .spec import PeftPolicy
from .targets import PeftTargets, check_injection, peft_target_modules, select_targets


@dataclass
class PeftReport(CountedByRole):
    """What :func:`apply_peft_policy` adapted, counted per role like :class:`attnft.methods.freeze.policy.PolicyReport`.

    ``total`` counts the base model's parameters by role; ``trainable`` counts the adapter
    tensors attached to modules of each role (the head's trained copy under ``head``).
    """

    method_name: ClassVar[str] = "peft"  # its family in attnft.methods.METHODS

    model_name: str
    policy: PeftPolicy
    role_map: RoleMap
    targets: PeftTargets
    base_fingerprint: str
    adapter_name: str = "default"
    adapter_numel: dict[Role, int] = field(default_factory=dict)

    def counts(self) -> list[RoleCount]:
        rows = {role: RoleCount(role, 0, 0) for role in Role}
        for entry in self.role_map:
            rows[entry.role].total += entry.numel
        for role, numel in self.adapter_numel.items():
            rows[role].trainable += numel
        return [row for row in rows.values() if row.total or row.trainable]

    def trained_tensors(self, peft_model: PeftModel) -> dict[str, torch.Tensor]:
        """The tensors an adapter saves, by peft's key (``base_model.model.<module>.lora_A.weight``)."""
        return get_peft_model_state_dict(peft_model, adapter_name=self.adapter_name)

    def adapter_bytes(self, peft_model: PeftModel) -> int:
        """Size in bytes of ``adapter_model.safetensors`` for this adapter, without writing it."""
        tensors = {k: v.contiguous() for k, v in self.trained_tensors(peft_model).items()}
        return len(safetensors.torch.save(tensors, metadata={"format": "pt"}))

    def to_dict(self) -> dict:
        return {
            **self.counts_dict(),
            "method": self.policy.method,
            "options": asdict(self.policy.options),
            "targets": {name: role.value for name, role in self.targets.modules.items()},
            "head_modules": self.targets.head,
            "untargeted": self.targets.untargeted,
        }

    def format_table(self) -> str:
        lines = self.counts_table()
        lines.append(f"\n{self.policy.method} on {len(self.targets.modules)} modules; head trained whole: {', '.join(self.targets.head) or 'no'}")
        if self.targets.untargeted:
            lines.append(f"{len(self.targets.untargeted)} tensors of the adapted roles stay frozen (no module {self.policy.method} can wrap)")
        return "\n".join(lines)

    def remove_hooks(self) -> None:
        """Nothing to remove: peft freezes by wrapping, not by gradient hooks (PolicyReport parity)."""


def apply_peft_policy(
    model: nn.Module,
    policy: Union[str, PeftPolicy] = "lora",
    role_map: Optional[RoleMap] = None,
    adapter_name: str = "default",
) -> tuple[PeftModel, PeftReport]:
    """Wrap ``model`` with the peft method of ``policy`` on the role map's modules.

    ``model`` is changed in place (peft replaces the targeted modules) and returned inside a
    ``PeftModel``; only the adapter tensors and the head copy train.

    Args:
        model: a timm or transformers model without peft adapters.
        policy: a peft spec (``lora``, ``lora+ffn:r=16,alpha=32``, ``lora:dora=true``, ``ia3``, ``lora@8-11``)
            or a parsed ``PeftPolicy``.
        role_map: the model's role map, if already built (default: built here).
        adapter_name: the name of the adapter inside the ``PeftModel``.

    Returns:
        ``(peft_model, report)``: the ``PeftModel`` to train, and a ``PeftReport`` of what trains (per role, the
        targeted modules, the base's fingerprint taken before wrapping); ``AdapterStore.save`` takes both.

    Raises:
        UnknownPolicyError: a spec peft's methods do not read, or one that finds no module to wrap.
        NoAttentionError: an attention policy on a model without attention.
        AdapterError: the model already carries peft adapters.
    """
    policy = policy if isinstance(policy, PeftPolicy) else PeftPolicy.parse(policy)
    if isinstance(model, PeftModel):
        raise AdapterError("the model already carries peft adapters: start from the plain base model")
    role_map = role_map or build_role_map(model)
    if Role.ATTENTION in policy.roles and not role_map.names_with_role(Role.ATTENTION):
        raise NoAttentionError(f"{role_map.model_name} has no attention weights: {policy.name!r} needs a Vision Transformer")
    targets = select_targets(model, policy, role_map)
    if not targets.modules:
        raise UnknownPolicyError(f"policy {policy.name!r} finds no module {policy.method} can wrap in {role_map.model_name}")
    _check_rank(model, policy, list(targets.modules), role_map.model_name)
    fingerprint = compute_fingerprint(model, role_map)  # before peft renames the targeted weights
    config = policy.peft_method.make_config(
        policy.options, peft_target_modules(model, list(targets.modules)), targets.feedforward, targets.head or None
    )
    peft_model = get_peft_model(model, config, adapter_name=adapter_name)
    check_injection(peft_model, targets)
    report = PeftReport(
        model_name=role_map.model_name,
        policy=policy,
        role_map=role_map,
        targets=targets,
        base_fingerprint=fingerprint,
        adapter_name=adapter_name,
    )
    report.adapter_numel = _numel_by_role(report.trained_tensors(peft_model), targets)
    return peft_model, report


def _check_rank(model: nn.Module, policy: PeftPolicy, modules: list[str], model_name: str) -> None:
    """A LoRA rank above every targeted layer's width adds parameters and no expressiveness (and r=1e9 asks
    for terabytes): UnknownPolicyError before peft allocates anything. (A small layer among them, such as
    a relative-position MLP's input, may be narrower than r, as peft allows.)"""
    rank = getattr(policy.options, "r", None)
    if rank is None:
        return
    width = max(max(_in_out(model.get_submodule(name))) for name in modules)
    if rank > width:
        raise UnknownPolicyError(f"policy {short(policy.name, 60)!r}: r={rank} is above the width of every targeted "
                                 f"layer of {model_name} (at most {width}): choose r <= {width}")


def _in_out(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, nn.Conv2d):
        return module.in_channels, module.out_channels
    return module.in_features, module.out_features


def param_groups(peft_model: PeftModel, weight_decay: float) -> list[dict]:
    """Optimizer parameter groups of the trainable tensors (``timm.optim.create_optimizer_v2`` takes them).

    timm's groups (no decay on biases and 1-D tensors), and none on IA3 scales either: they
    start at 1, decay would pull them towards 0, and peft holds them 2-D. An empty group is left out.
    """
    return param_groups_weight_decay(peft_model, weight_decay, no_weight_decay_list=no_decay_names(peft_model))


def no_decay_names(peft_model: PeftModel) -> list[str]:
    """The IA3 scales, by ``named_parameters`` name: never decayed (they start at 1)."""
    scales = {id(p) for module in peft_model.modules() if isinstance(module, IA3Layer) for p in module.ia3_l.parameters()}
    return [name for name, param in peft_model.named_parameters() if id(param) in scales]


def _numel_by_role(tensors: dict[str, torch.Tensor], targets: PeftTargets) -> dict[Role, int]:
    owners = {**targets.modules, **{name: Role.HEAD for name in targets.head}}
    counts: dict[Role, int] = {}
    for key, tensor in tensors.items():
        role = _owner_role(unprefixed(key), owners)
        counts[role] = counts.get(role, 0) + tensor.numel()
    return counts


def _owner_role(param: str, owners: dict[str, Role]) -> Role:
    # the innermost adapted module holding the tensor owns it
    path = module_of(param)
    while path:
        if path in owners:
            return owners[path]
        path = module_of(path)
    raise RuntimeError(f"adapter tensor {param} belongs to no adapted module")
