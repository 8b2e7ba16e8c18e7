"""One frozen backbone serving many attention adapters, one task per call or per sample.

Example::

    store = AdapterStore("adapters/")
    model = MultiTaskModel.from_store(store, ["cars", "flowers", "pets"], base_model=base)
    logits = model(images, task="cars")                      # (B, cars classes)
    outputs = model(images, tasks=["cars", "pets", "cars"])  # list: one (classes of its task,) tensor per sample

Adapters of other families are served by their own multi-task model, which has the same calls (each is a
:class:`attnft.methods.serving.TaskServer`): ``from_store`` and ``from_adapters`` return that family's when every
task is of it, and a :class:`attnft.methods.serving.MixedFamilies` when they mix families.

Threads. A forward call (``model(x, task=...)``, ``model(x, tasks=...)``, and ``model(x)``
after ``set_task``) mutates nothing shared: the task of a call is resolved once when it
starts and lives in a context variable of the calling thread. Forward calls may therefore
run from several threads at once, for the same or different tasks. ``add_task``,
``remove_task`` and ``set_task`` replace one entry or one reference, so they may run while
other threads serve; a call already running keeps the tasks it started with. ``set_task`` is
a process-wide default: threads that serve different tasks should pass ``task=`` instead.
"""
from __future__ import annotations

import os
from typing import Iterable, Mapping, Optional, Union

import torch
from torch import nn

from ....core.errors import AdapterError, BaseMismatchError
from ....roles import RoleMap, build_role_map
from ...base_model import current_input_size
from ...fingerprint import compute_fingerprint
from ...registry import family_of_task
from ...serving import TaskServer, check_base_model, serve_adapters, serve_store, storage_bytes, tensors_of
from ..config import Adapter
from . import routing
from .routing import Group, Route
from .slots import SlotMap, find_slots
from .tasks import ServedTask, TaskWeights, build_served_task

TaskSource = Union[TaskWeights, Adapter, str, os.PathLike, Mapping[str, torch.Tensor]]


class MultiTaskModel(TaskServer[ServedTask]):
    """Serve many tasks from one base model: patch embedding and FFN shared, attention, position
    embedding and head per task.

    Takes over ``base_model``: puts it in eval mode, freezes it and routes its attention, head
    and position tensors (see :mod:`.routing`); without a task it still
    computes the base's own outputs. Inference only: every call runs under
    ``torch.inference_mode()``. Tensors of added tasks move to the base's device and dtype.

    Call it as ``mt(x, task="name")`` (a tensor of logits), ``mt(x)`` after ``set_task("name")``, or
    ``mt(x, tasks=[one name per sample])`` (a list of logits, one per sample: heads may differ in classes).

    Args:
        base_model: the base every task was trained on; taken over (eval mode, frozen, its modules routed).
        role_map: the base's role map, if already built (default: built here).
    """

    def __init__(self, base_model: nn.Module, *, role_map: Optional[RoleMap] = None):
        check_base_model(base_model)
        super().__init__()
        self.base = base_model.eval().requires_grad_(False)
        self.role_map = role_map or build_role_map(base_model)
        self.slots: SlotMap = find_slots(base_model, self.role_map)
        routing.install(base_model, self.slots)
        self._fingerprint: Optional[str] = None

    # --- building -----------------------------------------------------------------------

    @classmethod
    def from_adapters(cls, base_model: nn.Module, adapters: Mapping[str, TaskSource]) -> TaskServer:
        """Serve each ``name -> adapter`` (an Adapter, an adapter folder, or TaskWeights) on ``base_model``: this
        model when all are attnft's, else the model of their family, or one of several families
        (:func:`attnft.methods.serving.serve_adapters`)."""
        return serve_adapters(base_model, adapters)

    @classmethod
    def from_store(cls, store, names: Iterable[str], *, base_model: nn.Module) -> TaskServer:
        """Serve the adapters ``names`` of an :class:`attnft.adapters.store.AdapterStore` on ``base_model``, as
        :meth:`from_adapters` does.

        Args:
            store (AdapterStore): the store holding the adapters.
            names: the adapters to serve; each becomes a task of the same name.
            base_model: the base they were trained on, created at the input size the calls will have.

        Returns:
            A ``MultiTaskModel`` when every adapter is attnft's own format; else the multi-task model of their
            family (``PeftMultiTask`` for peft's), or ``MixedFamilies`` for several families. Each is called the
            same way.

        Raises:
            StoreError: a name the store does not hold.
            BaseMismatchError: an adapter trained on another base.
            AdapterError: an adapter that does not verify or does not fit.
        """
        return serve_store(store, names, base_model)

    @property
    def base_fingerprint(self) -> str:
        """The base's :func:`attnft.methods.fingerprint.compute_fingerprint`, computed once."""
        if self._fingerprint is None:
            self._fingerprint = compute_fingerprint(self.base, self.role_map)
        return self._fingerprint

    def add_task(self, name: str, source: TaskSource) -> None:
        """Serve a new task ``name`` from an adapter, an adapter folder, TaskWeights or a name -> tensor dict.

        Args:
            name: the task's name in calls.
            source: an ``Adapter``, an adapter folder, ``TaskWeights`` or a name -> tensor dict.

        Raises:
            ConfigError: a task of that name is served already.
            BaseMismatchError: the adapter was trained on another base.
            AdapterError: it trains weights that tasks share (FFN, norms, patch embedding; part of a fused
                ``in_proj``, as on ``vit_*_xp_224``) or does not fit.
        """
        self._check_new_task(name)
        weights = self._task_weights(name, source)
        if weights.base_fingerprint is not None and weights.base_fingerprint != self.base_fingerprint:
            raise BaseMismatchError(
                f"task {name!r} was trained on a base with fingerprint {weights.base_fingerprint[:12]}, this "
                f"base's is {self.base_fingerprint[:12]}: every served task must share one base"
            )
        self._tasks[name] = build_served_task(name, weights, self.base, self.slots, self.role_map)

    def _task_weights(self, name: str, source: TaskSource) -> TaskWeights:
        if isinstance(source, (TaskWeights, Mapping)):
            tensors = source.tensors if isinstance(source, TaskWeights) else source
            broken = [key for key, t in tensors.items() if not isinstance(t, torch.Tensor)
                      or (t.is_floating_point() and not bool(torch.isfinite(t).all()))]
            if broken:
                raise AdapterError(f"task {name!r}: {broken[0]} is not a tensor of finite values: nothing was added")
        if isinstance(source, TaskWeights):
            return source
        method = family_of_task(source)
        if method is not None and not isinstance(self, method.server):
            raise AdapterError(
                f"task {name!r} is a {method.format_name} adapter and this model serves attnft adapters: serve it with "
                f"{method.server.__name__}, or serve them together with MultiTaskModel.from_store / from_adapters"
            )
        if method is not None:  # an adapter folder, or the adapter read from one
            adapter = method.read(source) if isinstance(source, (str, os.PathLike)) else source
            if not hasattr(adapter, "tensors"):  # a config or a report names its method but holds no weights
                raise TypeError(f"cannot serve a task from {type(source).__name__}: pass an adapter or its folder")
            size = current_input_size(self.base)
            if adapter.config.input_size != size:
                raise AdapterError(
                    f"task {name!r} was trained at {adapter.config.input_size}px, the base serves {size}px: "
                    "every served task must share the base's input size"
                )
            return TaskWeights.from_adapter(adapter, self.base)
        if isinstance(source, Mapping):
            return TaskWeights(dict(source))
        raise TypeError(f"cannot serve a task from {type(source).__name__}")

    # --- serving ------------------------------------------------------------------------

    def _forward(self, x: torch.Tensor, name: str, task: ServedTask) -> torch.Tensor:
        with routing.routed(Route.single(task, x.shape[0])):
            return self.base(x)

    def _forward_mixed(self, x: torch.Tensor, tasks: list[str], served: dict[str, ServedTask]) -> list[torch.Tensor]:
        """The batch is sorted by task once; patch embedding and FFN run once over it, attention once per task group."""
        positions: dict[str, list[int]] = {name: [] for name in served}
        for i, name in enumerate(tasks):
            positions[name].append(i)
        order = [i for indices in positions.values() for i in indices]
        groups, start = [], 0
        for name, indices in positions.items():
            groups.append(Group(served[name], start, start + len(indices)))
            start += len(indices)
        x = x[torch.tensor(order, device=x.device)]
        with routing.routed(Route(groups, x.shape[0])):
            features = self.base.forward_features(x)
        outputs: list[Optional[torch.Tensor]] = [None] * len(order)
        for group in groups:
            with routing.routed(Route.single(group.task, group.stop - group.start)):
                logits = self.base.forward_head(features[group.start:group.stop])
            for row, sample in zip(logits.unbind(0), order[group.start:group.stop]):
                outputs[sample] = row
        return outputs

    # --- accounting ---------------------------------------------------------------------

    def memory_bytes(self) -> dict[str, int]:
        """Bytes of tensor storage held: ``shared`` (the base), each task's own, and ``total``.

        Storages are counted once however many modules share them.
        """
        seen: set[int] = set()
        usage = {"shared": storage_bytes(tensors_of(self.base), seen)}
        for name, task in self._tasks.items():
            tensors = list(task.tensors.values())
            for module in task.modules.values():
                tensors.extend(tensors_of(module))
            usage[name] = storage_bytes(tensors, seen)
        usage["total"] = sum(usage.values())
        return usage

    def base_module(self) -> nn.Module:
        return self.base

    def __repr__(self) -> str:
        return f"MultiTaskModel({self.role_map.model_name}, tasks={self.tasks}, default={self._default!r})"
