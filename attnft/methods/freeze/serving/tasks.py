"""What a served task is: its own tensors, and the light modules that hold them.

A task brings full values (not deltas) for the parameters it trained, by base parameter
name. Serving turns them into :class:`ServedTask`: for each module slot a clone of the
base module's object tree that holds the task's tensors and shares every other tensor and
buffer with the base (no weight is copied), and for each tensor slot the tensor itself.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping, Optional

import torch
from torch import nn

from ..config import Adapter
from ....core.errors import AdapterError
from ..policy import PolicyReport
from ....roles import Role, RoleMap, is_weight, split_first
from .slots import Slot, SlotKind, SlotMap


@dataclass
class TaskWeights:
    """One task's own tensors: full trained values by base parameter name, and its labels."""

    tensors: dict[str, torch.Tensor]
    label_names: Optional[list[str]] = None
    base_fingerprint: Optional[str] = None  # checked against the base when given

    @classmethod
    def from_trained(cls, model: nn.Module, report: PolicyReport, label_names: Optional[list[str]] = None) -> "TaskWeights":
        """The trained tensors of a fine-tuned ``model`` (a copy: training the model on does not change them)."""
        split = [name for name, region in report.trainable.items() if region is not None]
        if split:
            raise AdapterError(f"{split[0]} trains only part of a fused tensor: such a model cannot share its FFN across tasks")
        tensors = {name: t.detach().clone() for name, t in report.trained_tensors(model).items()}
        return cls(tensors, label_names=label_names)

    @classmethod
    def from_adapter(cls, adapter: Adapter, base_model: nn.Module) -> "TaskWeights":
        """The trained values of an :class:`attnft.methods.freeze.config.Adapter` (deltas resolved against ``base_model``)."""
        split = [name for name, region in adapter.regions.items() if region is not None]
        if split:
            raise AdapterError(f"{split[0]} trains only part of a fused tensor: such a model cannot share its FFN across tasks")
        config = adapter.config
        return cls(
            dict(adapter.trained_values(base_model)),
            label_names=list(config.label_names) if config.label_names else None,
            base_fingerprint=config.base_fingerprint,
        )


@dataclass(frozen=True)
class ServedTask:
    """A task ready to serve: a module per module slot it changes, a tensor per tensor slot."""

    name: str
    modules: dict[str, nn.Module]  # slot path -> the task's clone of that module
    tensors: dict[str, torch.Tensor]  # slot path -> the task's tensor
    num_classes: int
    label_names: Optional[list[str]] = None


def build_served_task(
    name: str, weights: TaskWeights, base_model: nn.Module, slots: SlotMap, role_map: RoleMap
) -> ServedTask:
    """Check ``weights`` against the base and give each slot the task's values."""
    base_params = dict(base_model.named_parameters())
    any_param = next(iter(base_params.values()))
    per_slot: dict[Slot, dict[str, torch.Tensor]] = {}
    for param_name, value in weights.tensors.items():
        slot = slots.of(param_name, role_map)
        base = base_params.get(param_name, any_param)  # a new classifier takes the base's device and dtype
        if slot.kind != SlotKind.HEAD and tuple(value.shape) != tuple(base.shape):
            raise AdapterError(
                f"task {name!r}: {param_name} has shape {tuple(value.shape)}, the base has {tuple(base.shape)}"
            )
        value = value.detach().to(device=base.device, dtype=base.dtype)
        per_slot.setdefault(slot, {})[slot.relative(param_name)] = value
    modules, tensors = {}, {}
    for slot, values in per_slot.items():
        if slot.is_tensor:
            tensors[slot.path] = values[""]
        elif slot.path in slots.empty_heads:
            modules[slot.path] = _new_linear(slot.path, values)
        else:
            modules[slot.path] = _clone_slot_module(base_model.get_submodule(slot.path), values)
    return ServedTask(name, modules, tensors, _num_classes(weights, base_params, role_map), weights.label_names)


def _clone_slot_module(module: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
    clone = clone_with(module, tensors)
    # the base module is routed (see routing.py); the clone is the plain module it was
    clone.__class__ = getattr(type(module), "_attnft_base_class", type(module))
    clone.__dict__.pop("_attnft_slot", None)
    # hooks on the base module already ran when the routed call reached it: not twice
    for key, value in list(vars(clone).items()):
        if key.startswith(("_forward_", "_backward_")) and isinstance(value, dict):
            clone.__dict__[key] = type(value)()
    return clone


def _new_linear(path: str, tensors: dict[str, torch.Tensor]) -> nn.Linear:
    """The classifier of a task served on a base built without one (num_classes=0)."""
    weight, bias = tensors.get("weight"), tensors.get("bias")
    if weight is None or weight.ndim != 2 or set(tensors) - {"weight", "bias"}:
        raise AdapterError(f"the base has no {path}; a task can only bring a linear one (weight and bias), not {sorted(tensors)}")
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


def clone_with(module: nn.Module, tensors: Mapping[str, torch.Tensor]) -> nn.Module:
    """A new object tree for ``module`` holding ``tensors`` (names relative to it) and sharing the rest.

    Only modules on the path to a replaced tensor are new objects; their other parameters,
    their buffers, their hooks and every untouched child are the base's own objects (so a hook added to the base
    later reaches the tasks too; one that another family adds with tensors of its own finds none here, and passes).
    """
    clone = copy.copy(module)  # shallow: attribute values are shared, the three dicts below too
    own: dict[str, torch.Tensor] = {}
    children: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        child, rest = split_first(key)
        if rest:
            children.setdefault(child, {})[rest] = value
        else:
            own[key] = value
    unknown = [key for key in own if key not in module._parameters] + [c for c in children if c not in module._modules]
    if unknown:
        raise AdapterError(f"{type(module).__name__} has no parameter {unknown[0]}")
    clone.__dict__["_parameters"] = {
        key: nn.Parameter(own[key], requires_grad=False) if key in own else param for key, param in module._parameters.items()
    }
    clone.__dict__["_buffers"] = dict(module._buffers)
    clone.__dict__["_modules"] = {
        key: clone_with(child, children[key]) if key in children else child for key, child in module._modules.items()
    }
    if isinstance(clone, nn.Linear):
        clone.out_features = clone.weight.shape[0]  # a task's head may have its own number of classes
    return clone


def _num_classes(weights: TaskWeights, base_params: dict[str, torch.Tensor], role_map: RoleMap) -> int:
    """Classes of the task's head: the rows of its last head weight (the base's if it brings none)."""
    head_names = role_map.names_with_role(Role.HEAD) + [n for n in weights.tensors if n not in base_params]
    head_weights = [n for n in head_names if is_weight(n) and weights.tensors.get(n, base_params.get(n)).ndim == 2]
    if not head_weights:
        return 0
    last = head_weights[-1]
    return int(weights.tensors.get(last, base_params.get(last)).shape[0])
