"""What every family's multi-task server shares: tasks by name, a default task, and the calls that dispatch; and
the server of several families on one base.

Each family's server (``Method.server``: :class:`attnft.multitask.MultiTaskModel` for attnft adapters, routed
attention; :class:`attnft.multitask.PeftMultiTask` for peft's; ...) differs only in how a batch of one task, or of
mixed tasks, runs (:meth:`TaskServer._forward`, :meth:`TaskServer._forward_mixed`); which task a call serves, and
the checks on it, are here. :func:`serve_adapters` picks the server of a set of adapters, and
:class:`MixedFamilies` serves a set that mixes families.
"""
from __future__ import annotations

import copy
from typing import Any, Generic, Iterable, Mapping, Optional, Sequence, TypeVar

import torch
from torch import nn

from ..core.checks import check_type
from ..core.errors import ConfigError
from .registry import fallback, family_of_task

Task = TypeVar("Task")  # what a server keeps per task; has num_classes and label_names


class TaskServer(Generic[Task]):
    """Served tasks by name, in the order they were added, and the default task of calls that name none."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._default: Optional[str] = None

    # --- the tasks ----------------------------------------------------------------------

    def _check_new_task(self, name: str) -> None:
        """ConfigError unless ``name`` can name a task not served yet."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a task name must be a non-empty string, not {name!r}")
        if name in self._tasks:
            raise ConfigError(f"task {name!r} is already served: remove it first")

    def remove_task(self, name: str) -> None:
        """Stop serving ``name`` and free its tensors (calls already running finish with it)."""
        self._served(name)
        self._release(name)
        del self._tasks[name]
        if self._default == name:
            self._default = None

    def _release(self, name: str) -> None:
        """Free what the server holds for task ``name`` besides its entry (nothing by default)."""

    def set_task(self, name: Optional[str]) -> None:
        """The task of calls that name none (None: calls must name one). Copies nothing."""
        if name is not None:
            self._served(name)
        self._default = name

    @property
    def task(self) -> Optional[str]:
        """The task of calls that name none."""
        return self._default

    @property
    def tasks(self) -> list[str]:
        """Names of the served tasks, in the order they were added."""
        return list(self._tasks)

    def num_classes(self, task: str) -> Optional[int]:
        return self._served(task).num_classes

    def label_names(self, task: str) -> Optional[list]:
        return self._served(task).label_names

    def _served(self, name: str) -> Task:
        try:
            return self._tasks[name]
        except KeyError:
            served = ", ".join(self._tasks) or "none"
            raise ConfigError(f"unknown task {name!r}: served tasks are {served}") from None

    # --- serving ------------------------------------------------------------------------

    def base_module(self) -> torch.nn.Module:
        """The shared base model."""
        raise NotImplementedError

    def _check_batch(self, x) -> None:
        """ConfigError unless ``x`` is a non-empty batch [B, C, H, W] at the base's size (not the patch
        embedding's bare assertion, or an IndexError for an empty one)."""
        if not isinstance(x, torch.Tensor) or x.ndim != 4 or x.shape[0] == 0:
            shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ConfigError(f"a batch is a tensor [B >= 1, channels, H, W], got {shape}")
        first = next(self.base_module().parameters(), None)
        if first is not None and x.dtype != first.dtype:
            raise ConfigError(f"the batch is {x.dtype}, the base computes in {first.dtype}: normalise the images and "
                              f"cast them (x.to({first.dtype}))")
        channels = _in_channels(self.base_module())
        if channels is not None and x.shape[1] != channels:
            raise ConfigError(f"the batch has {x.shape[1]} channel(s), the base takes {channels}: convert the images "
                              "(e.g. to RGB)")
        size = _fixed_input_size(self.base_module())
        if size is not None and tuple(x.shape[-2:]) != size:
            raise ConfigError(f"the batch is {x.shape[-2]}x{x.shape[-1]} px, the base is built for {size[0]}x{size[1]}: "
                              "resize the images, or build the base at their size (img_size=...)")

    def __call__(self, x: torch.Tensor, task: Optional[str] = None, tasks: Optional[Sequence[str]] = None):
        """``tasks`` given: :meth:`forward_mixed` (a list); else :meth:`forward` (a tensor)."""
        if tasks is not None:
            if task is not None:
                raise ConfigError("pass task= (one task for the batch) or tasks= (one per sample), not both")
            return self.forward_mixed(x, tasks)
        return self.forward(x, task)

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, task: Optional[str] = None) -> torch.Tensor:
        """Logits (B, classes of ``task``) of a batch that is all one task (None: the one set with set_task)."""
        self._check_batch(x)
        name = task if task is not None else self._default
        if name is None:
            if not self._tasks:
                raise ConfigError("no task is served: add_task() first")
            raise ConfigError(f"name a task (task=...) or set_task(...): served tasks are {', '.join(self._tasks)}")
        return self._forward(x, name, self._served(name))

    @torch.inference_mode()
    def forward_mixed(self, x: torch.Tensor, tasks: Sequence[str]) -> list[torch.Tensor]:
        """Logits of a batch mixing tasks: ``tasks[i]`` serves sample ``i``.

        Returns a list of B tensors in sample order, sample ``i``'s of shape (classes of
        ``tasks[i]``,); stack them when all tasks have as many classes.
        """
        self._check_batch(x)
        if isinstance(tasks, str) or len(tasks) != x.shape[0]:
            raise ConfigError(f"tasks= needs one task name per sample: {x.shape[0]} samples, got {tasks!r}"[:300])
        served = {name: self._served(name) for name in dict.fromkeys(tasks)}  # resolved once, in order of first use
        if len(served) == 1:
            return list(self._forward(x, tasks[0], served[tasks[0]]).unbind(0))
        return self._forward_mixed(x, list(tasks), served)

    def _forward(self, x: torch.Tensor, name: str, task: Task) -> torch.Tensor:
        """Logits of a batch that is all task ``name``."""
        raise NotImplementedError

    def _forward_mixed(self, x: torch.Tensor, tasks: list[str], served: dict[str, Task]) -> list[torch.Tensor]:
        """Logits of a batch of two or more tasks, ``served`` holding each (in order of first use)."""
        raise NotImplementedError


def _in_channels(base: torch.nn.Module) -> Optional[int]:
    """The channels the base's patch embedding takes (timm's ``patch_embed.proj``), or None when not known (a
    hybrid's projection reads its CNN's features, not the image)."""
    embed = getattr(base, "patch_embed", None)
    if embed is None or hasattr(embed, "backbone"):
        return None
    return getattr(getattr(embed, "proj", None), "in_channels", None)


def check_base_model(base_model) -> None:
    """TypeError naming the argument unless ``base_model`` is a module: every server's first check."""
    check_type(base_model, nn.Module, "base_model", "a torch.nn.Module (the base the adapters were trained on)")


def _fixed_input_size(base: torch.nn.Module) -> Optional[tuple[int, int]]:
    """(H, W) where the base's patch embedding refuses any other size (timm's ``strict_img_size``), else None."""
    embed = getattr(base, "patch_embed", None)
    size = getattr(embed, "img_size", None)
    if not getattr(embed, "strict_img_size", False) or getattr(embed, "dynamic_img_size", False) or size is None:
        return None
    return tuple(int(s) for s in size) if isinstance(size, (tuple, list)) else (int(size), int(size))


def tensors_of(module: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of ``module``."""
    return [*module.parameters(), *module.buffers()]


def storage_bytes(tensors: Iterable[torch.Tensor], seen: Optional[set[int]] = None) -> int:
    """Bytes of the storages behind ``tensors``, each counted once (and not again if in ``seen``, which grows)."""
    seen = set() if seen is None else seen
    total = 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in seen and storage.nbytes():
            seen.add(key)
            total += storage.nbytes()
    return total


# --- several families on one base ------------------------------------------------------------


def serve_adapters(base_model: nn.Module, adapters: Mapping[str, Any]) -> TaskServer:
    """A server of each ``name -> adapter`` (a folder, what a family read from one, or tensors in memory, which the
    fallback family takes) on ``base_model``: the family's own server when they are of one family, else
    :class:`MixedFamilies`."""
    families = {(family_of_task(source) or fallback()) for source in adapters.values()}
    server = next(iter(families)).server(base_model) if len(families) == 1 else MixedFamilies(base_model)
    for name, source in adapters.items():
        server.add_task(name, source)
    return server


def serve_store(store, names: Iterable[str], base_model: nn.Module) -> TaskServer:
    """:func:`serve_adapters` of the adapters ``names`` of an :class:`attnft.adapters.store.AdapterStore`."""
    if isinstance(names, str):
        raise TypeError(f"names is a list of adapter names, not the string {names!r}"[:200])
    names = list(names)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"names is a list of adapter names, not {names!r}"[:200])
    return serve_adapters(base_model, {name: store.folder(name) for name in names})  # StoreError: a name not stored


class MixedFamilies(TaskServer[TaskServer]):
    """Tasks of several method families on one base, each held by its family's server.

    This is the one place where families meet: a batch that mixes them is split by family, each family's server
    runs its own samples (in one call of its own, mixed-task where it can), and the outputs return in sample order.
    The servers of families whose modules leave the base as it was when a call is not theirs
    (``Method.shares_base``) share ``base_model``; a family whose server rewraps the base's modules (peft's) gets its
    own copy of it.
    """

    def __init__(self, base_model: nn.Module):
        check_base_model(base_model)
        super().__init__()
        self.base = base_model
        self.servers: dict[str, TaskServer] = {}  # family name -> its server

    def server_of(self, method) -> TaskServer:
        """The server of ``method``'s tasks, made on first use."""
        if method.name not in self.servers:
            base = self.base if method.shares_base else copy.deepcopy(self.base)
            self.servers[method.name] = method.server(base)
        return self.servers[method.name]

    def add_task(self, name: str, source) -> None:
        """Serve task ``name`` from an adapter of any family (as its family's server takes it)."""
        self._check_new_task(name)
        server = self.server_of(family_of_task(source) or fallback())
        server.add_task(name, source)
        self._tasks[name] = server

    def _release(self, name: str) -> None:
        self._tasks[name].remove_task(name)

    def num_classes(self, task: str) -> Optional[int]:
        return self._served(task).num_classes(task)

    def label_names(self, task: str) -> Optional[list]:
        return self._served(task).label_names(task)

    def base_module(self) -> nn.Module:
        return self.base

    def _forward(self, x: torch.Tensor, name: str, task: TaskServer) -> torch.Tensor:
        return task.forward(x, name)

    def _forward_mixed(self, x: torch.Tensor, tasks: list[str], served: dict[str, TaskServer]) -> list[torch.Tensor]:
        """Split by family: each family's server runs its samples once, their outputs go back to sample order."""
        by_server: dict[int, list[int]] = {}
        for i, name in enumerate(tasks):
            by_server.setdefault(id(served[name]), []).append(i)
        outputs: list[Optional[torch.Tensor]] = [None] * len(tasks)
        for indices in by_server.values():
            server = served[tasks[indices[0]]]
            rows = server.forward_mixed(x[torch.tensor(indices, device=x.device)], [tasks[i] for i in indices])
            for i, row in zip(indices, rows):
                outputs[i] = row
        return outputs

    def memory_bytes(self) -> dict[str, int]:
        """Bytes of tensor storage held: ``shared`` (the base, and the copies of it some families hold), each task's
        own, and ``total``."""
        seen: set[int] = set()
        usage = {"shared": storage_bytes(tensors_of(self.base), seen)}
        for server in self.servers.values():
            if server.base_module() is not self.base:
                usage["shared"] += storage_bytes(tensors_of(server.base_module()), seen)
            usage.update((k, v) for k, v in server.memory_bytes().items() if k not in ("shared", "total"))
        usage["total"] = sum(usage.values())
        return usage

    def __repr__(self) -> str:
        return f"MixedFamilies({', '.join(self.servers)}, tasks={self.tasks})"
