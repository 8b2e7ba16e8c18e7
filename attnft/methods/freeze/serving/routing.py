"""How one forward call reaches each task's modules and tensors without touching the base.

Every slot of the base model is *routed*: its class is swapped for a subclass of the same
name whose ``forward`` (module slots) or attribute (tensor slots) looks up the active
:class:`Route` and answers with the task's clone or tensor. The object graph, the parameter
names and the state dict of the base stay as they were, so the role map, the fingerprint
and ``load_state_dict`` keep working. With no active route a routed slot is the base itself.

The active route lives in a :class:`contextvars.ContextVar`: each thread (and each asyncio
task) sees only its own, so concurrent forward calls for different tasks do not interfere,
and a forward call mutates nothing shared.

In a batch that mixes tasks the batch is sorted by task, so each task's samples form one
contiguous range (a *group*). Attention in a block runs once per group on that group's rows
(a view, no copy) and the outputs are concatenated; everything outside the slots runs once
for the whole batch. An attention module's first argument must hold each sample's rows
together (Swin's windows are); its other arguments (window masks, rotary tables, feature
sizes) reach every group unchanged, so per-sample attention masks are not supported in mixed
batches. Each group adds one attention call per block, whose fixed cost (operator launches,
0.1-0.3 ms on a 2-core CPU) is small next to ViT-S/B at 224 px but dominates toy inputs.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
from torch import nn

from ....core.errors import ConfigError
from .slots import Slot, SlotKind, SlotMap
from .tasks import ServedTask

_ACTIVE: contextvars.ContextVar[Optional["Route"]] = contextvars.ContextVar("attnft_multitask_route", default=None)

# methods through which model code calls a routed module (vit_relpos reads its shared table with get_bias())
ENTRY_METHODS = ("forward", "get_bias")


@dataclass(frozen=True)
class Group:
    """The samples ``[start, stop)`` of a sorted batch that one task serves."""

    task: ServedTask
    start: int
    stop: int


@dataclass
class Route:
    """Which task serves which samples during one forward call."""

    groups: list[Group]
    num_samples: int
    _cache: dict = field(default_factory=dict)  # per-call values of tensor slots in mixed batches

    @classmethod
    def single(cls, task: ServedTask, num_samples: int) -> "Route":
        return cls([Group(task, 0, num_samples)], num_samples)

    @property
    def is_mixed(self) -> bool:
        return len(self.groups) > 1


@contextlib.contextmanager
def routed(route: Route) -> Iterator[None]:
    """Make ``route`` the active one in this thread / context for the ``with`` body."""
    token = _ACTIVE.set(route)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


class PerTask:
    """A value that differs per task (a shared relative position bias), passed from the
    shared module to the blocks' attention, which picks its group's value."""

    def __init__(self, values: dict[str, Any]):
        self.values = values  # task name -> value

    def __repr__(self) -> str:
        return f"PerTask({', '.join(self.values)})"


# --- installing routes on the base model ----------------------------------------------------


def install(model: nn.Module, slots: SlotMap) -> None:
    """Route every slot of ``model`` (idempotent; the model keeps working unchanged without a route)."""
    tensor_attrs: dict[str, dict[str, Slot]] = {}
    for slot in slots:
        if slot.is_tensor:
            tensor_attrs.setdefault(slot.owner, {})[slot.attr] = slot
            continue
        module = model.get_submodule(slot.path)
        base_cls = getattr(type(module), "_attnft_base_class", type(module))
        module.__class__ = _routed_module_class(base_cls)
        module.__dict__["_attnft_slot"] = slot
    for owner_path, attrs in tensor_attrs.items():
        owner = model.get_submodule(owner_path)
        base_cls = getattr(type(owner), "_attnft_base_class", type(owner))
        owner.__class__ = _routed_owner_class(base_cls, tuple(sorted(attrs)))
        owner.__dict__["_attnft_tensor_slots"] = attrs


_CLASSES: dict[tuple, type] = {}


def _routed_module_class(base_cls: type) -> type:
    key = ("module", base_cls)
    if key not in _CLASSES:
        namespace = {"_attnft_base_class": base_cls, "__module__": base_cls.__module__, "__qualname__": base_cls.__qualname__}
        for method in ENTRY_METHODS:
            if hasattr(base_cls, method):
                namespace[method] = _routed_method(base_cls, method)
        # same name, so class-name checks (the role map) see the family's own class
        _CLASSES[key] = type(base_cls.__name__, (base_cls,), namespace)
    return _CLASSES[key]


def _routed_owner_class(base_cls: type, attrs: tuple[str, ...]) -> type:
    key = ("owner", base_cls, attrs)
    if key not in _CLASSES:
        namespace = {"_attnft_base_class": base_cls, "__module__": base_cls.__module__, "__qualname__": base_cls.__qualname__}
        for attr in attrs:
            namespace[attr] = _routed_tensor(attr)
        _CLASSES[key] = type(base_cls.__name__, (base_cls,), namespace)
    return _CLASSES[key]


def _routed_method(base_cls: type, method: str):
    base_method = getattr(base_cls, method)

    def call(self, *args, **kwargs):
        route = _ACTIVE.get()
        if route is None:
            return base_method(self, *args, **kwargs)
        return _dispatch(route, self.__dict__["_attnft_slot"], self, base_method, method, args, kwargs)

    call.__name__ = method
    call.__doc__ = base_method.__doc__
    return call


def _routed_tensor(attr: str) -> property:
    def get(self):
        base = self._parameters[attr]
        route = _ACTIVE.get()
        if route is None:
            return base
        return _tensor_for(route, self.__dict__["_attnft_tensor_slots"][attr], base)

    return property(get, doc=f"{attr}, the active task's own when it has one")


# --- answering a call -----------------------------------------------------------------------


def _call(task: ServedTask, slot: Slot, base_module: nn.Module, base_method, method: str, args, kwargs):
    """Call ``method`` of the task's module, or of the base module when the task has none here."""
    module = task.modules.get(slot.path)
    if module is None:
        return base_method(base_module, *args, **kwargs)
    return getattr(module, method)(*args, **kwargs)


def _dispatch(route: Route, slot: Slot, base_module: nn.Module, base_method, method: str, args, kwargs):
    if not route.is_mixed:
        return _call(route.groups[0].task, slot, base_module, base_method, method, args, kwargs)
    if slot.kind == SlotKind.BLOCK_ATTENTION:
        return _per_group(route, slot, base_module, base_method, method, args, kwargs)
    if slot.kind == SlotKind.SHARED_ATTENTION:
        return PerTask({g.task.name: _call(g.task, slot, base_module, base_method, method, args, kwargs) for g in route.groups})
    if slot.kind == SlotKind.POS_EMBED_MODULE:
        return _per_sample_rows(route, slot, base_module, base_method, method, args, kwargs)
    raise RuntimeError(f"{slot.path} ({slot.kind.value}) was called for a mixed batch; heads run once per task group")


def _per_group(route: Route, slot: Slot, base_module, base_method, method, args, kwargs):
    """Run the module once per task group on that group's rows and concatenate the outputs."""
    x = args[0]
    rows = x.shape[0]
    if rows % route.num_samples:
        raise ConfigError(
            f"{slot.path} gets {rows} rows for {route.num_samples} samples: mixed batches need the rows of each sample together"
        )
    per_sample = rows // route.num_samples  # windows per image in Swin, 1 elsewhere
    outputs = []
    for run_task, start, stop in _runs(route, slot, args, kwargs):
        sub_args = (x[start * per_sample:stop * per_sample],) + _pick(args[1:], run_task)
        outputs.append(_call(run_task, slot, base_module, base_method, method, sub_args, _pick(kwargs, run_task)))
    if len(outputs) == 1:
        return outputs[0]
    return _concat(outputs)


def _runs(route: Route, slot: Slot, args, kwargs) -> list[tuple[ServedTask, int, int]]:
    """Groups in order, merging neighbours that use the same module here (tasks that did not train it)."""
    varies = any(isinstance(a, PerTask) for a in list(args) + list(kwargs.values()))
    runs: list[tuple[ServedTask, int, int]] = []
    for group in route.groups:
        if runs and not varies and runs[-1][0].modules.get(slot.path) is group.task.modules.get(slot.path):
            runs[-1] = (runs[-1][0], runs[-1][1], group.stop)
        else:
            runs.append((group.task, group.start, group.stop))
    return runs


def _pick(values, task: ServedTask):
    """Replace every :class:`PerTask` among ``values`` (a tuple or a dict) with ``task``'s value."""
    if isinstance(values, dict):
        return {k: v.values[task.name] if isinstance(v, PerTask) else v for k, v in values.items()}
    return tuple(v.values[task.name] if isinstance(v, PerTask) else v for v in values)


def _concat(outputs: list):
    """Concatenate per-group outputs along rows; in tuples, non-row entries (sizes) come from the first."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs)
    if isinstance(first, tuple):
        return tuple(
            torch.cat([o[i] for o in outputs]) if isinstance(item, torch.Tensor) and item.ndim else item
            for i, item in enumerate(first)
        )
    raise TypeError(f"cannot combine per-group outputs of type {type(first).__name__}")


def _per_sample_rows(route: Route, slot: Slot, base_module, base_method, method, args, kwargs) -> torch.Tensor:
    """A module computing a whole batch's rows (XCiT's position encoding): each sample's row from its task."""
    parts = []
    for group in route.groups:
        out = _call(group.task, slot, base_module, base_method, method, args, kwargs)
        if not isinstance(out, torch.Tensor) or out.shape[0] != route.num_samples:
            raise ConfigError(f"{slot.path} does not return one row per sample, so it cannot serve a mixed batch")
        parts.append(out[group.start:group.stop])
    return torch.cat(parts)


def _tensor_for(route: Route, slot: Slot, base: torch.Tensor) -> torch.Tensor:
    if not route.is_mixed:
        return route.groups[0].task.tensors.get(slot.path, base)
    if slot.kind != SlotKind.SAMPLE_TENSOR:
        raise RuntimeError(f"{slot.path} ({slot.kind.value}) was read for a mixed batch; heads run once per task group")
    if slot.path not in route._cache:
        route._cache[slot.path] = _expand_per_sample(route, slot, base)
    return route._cache[slot.path]


def _expand_per_sample(route: Route, slot: Slot, base: torch.Tensor) -> torch.Tensor:
    """One copy of the tensor per sample, its task's: (1, ...) -> (num_samples, ...)."""
    values = [g.task.tensors.get(slot.path, base) for g in route.groups]
    if all(v is values[0] for v in values):
        return values[0]
    if base.shape[0] != 1:
        raise ConfigError(f"{slot.path} has shape {tuple(base.shape)}: only tensors with a leading size-1 batch dim can differ per sample")
    return torch.cat([v.expand(g.stop - g.start, *v.shape[1:]) for v, g in zip(values, route.groups)])
