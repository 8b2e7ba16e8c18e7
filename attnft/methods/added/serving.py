""":class:`AddedServer`: many tasks of one family that adds modules, on one base, one task per call or per sample.

The family's modules are added once with one row per task (and row 0, the base's own where the family has an
identity: SSF's unit scale, AdaptFormer's zero branch). A call sets each sample's row (:func:`attnft.methods.rows.task_rows`)
and the modules gather their values in one batched index — no per-task loop — then each task's head runs on its
own samples. Forward calls run one at a time (a lock: the heads are swapped in for a call).
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Optional

import torch
from torch import nn
from torch.func import functional_call

from ...core.errors import AdapterError, BaseMismatchError
from ..base_model import current_input_size
from ..fingerprint import compute_fingerprint
from ..registry import method_of
from ..rows import task_rows
from ..serving import TaskServer, check_base_model, storage_bytes
from .format import AddedAdapter
from .spec import AddedPolicy


class _Head(nn.Module):
    """The base's ``forward_head`` as a module, so a task's head tensors can be passed in for one call."""

    def __init__(self, base: nn.Module):
        super().__init__()
        self.base = base

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.base.forward_head(features)


class AddedServer(TaskServer[AddedAdapter]):
    """Tasks of one family (its ``method``, set by the first task) and one set of options on ``base_model``."""

    def __init__(self, base_model: nn.Module):
        check_base_model(base_model)
        super().__init__()
        self.base = base_model.eval().requires_grad_(False)
        self.base_fingerprint = compute_fingerprint(base_model)
        self.method = None
        self.policy: Optional[AddedPolicy] = None
        self._rows: dict[str, int] = {}
        self._head = _Head(self.base)
        self._lock = threading.Lock()

    def base_module(self) -> nn.Module:
        return self.base

    def add_task(self, name: str, source) -> None:
        """Serve a task from an adapter folder of the family (or the adapter read from one)."""
        self._check_new_task(name)
        method = method_of(source)
        adapter = source if isinstance(source, AddedAdapter) else method.read(source)
        config = adapter.config
        if self.method is not None and method is not self.method:
            raise AdapterError(f"task {name!r} is a {method.name} adapter; this server serves {self.method.name}")
        policy = AddedPolicy.parse(config.policy, method.name, method.options_cls)
        if self.policy is not None and (policy.options, policy.blocks) != (self.policy.options, self.policy.blocks):
            raise AdapterError(f"task {name!r} is {config.policy!r}; this server's tasks are {self.policy.name!r}: "
                               "tasks of one server share the modules' options")
        if config.base_fingerprint != self.base_fingerprint:
            raise BaseMismatchError(f"task {name!r} was trained on a base with fingerprint "
                                    f"{config.base_fingerprint[:12]}, this base's is {self.base_fingerprint[:12]}")
        size = current_input_size(self.base)
        if config.input_size != size:
            raise AdapterError(f"task {name!r} was trained at {config.input_size}px, the base serves {size}px")
        method.check_model(self.base)
        self.method, self.policy = method, policy
        place = self._place()
        tensors = {k: v.to(device=place.device, dtype=place.dtype) for k, v in adapter.tensors.items()}
        self._tasks[name] = dataclasses.replace(adapter, tensors=tensors)
        self._restack()

    def _place(self) -> torch.Tensor:
        """A tensor of the base's own (the family's modules are registered after it): the device and dtype it is
        served in, which a served base may have been moved or cast to (bf16) after it was built."""
        return next(self.base.parameters())

    def _release(self, name: str) -> None:
        del self._tasks[name]
        self._restack(without=name)

    def _restack(self, without: Optional[str] = None) -> None:
        """The family's modules again with one row per task (row 0 the base's own), each task's values in its row."""
        names = [n for n in self._tasks if n != without]
        with self._lock:
            self.method.remove(self.base)
            place = self._place()
            added = self.method.add(self.base, self.policy.options, blocks=self.policy.blocks, tasks=len(names) + 1)
            params = dict(self.base.named_parameters())
            with torch.no_grad():
                for tensor in added:
                    params[tensor].data = params[tensor].data.to(device=place.device, dtype=place.dtype)
                for row, task in enumerate(names, start=1):
                    for tensor in added:
                        params[tensor][row] = self._tasks[task].tensors[tensor][0]
            for param in params.values():
                param.requires_grad_(False)
            self._rows = {task: row for row, task in enumerate(names, start=1)}

    def _heads(self, task: AddedAdapter) -> dict[str, torch.Tensor]:
        return {f"base.{name}": task.tensors[name] for name in task.config.head}

    def _forward(self, x: torch.Tensor, name: str, task: AddedAdapter) -> torch.Tensor:
        rows = torch.full((x.shape[0],), self._rows[name], dtype=torch.long, device=x.device)
        with self._lock, task_rows({self.method.name: rows}):
            features = self.base.forward_features(x)
            return functional_call(self._head, self._heads(task), (features,))

    def _forward_mixed(self, x: torch.Tensor, tasks: list[str], served: dict[str, AddedAdapter]) -> list[torch.Tensor]:
        """The backbone once over the whole batch (each sample its task's rows), then each task's head on its own."""
        rows = torch.tensor([self._rows[name] for name in tasks], dtype=torch.long, device=x.device)
        outputs: list[Optional[torch.Tensor]] = [None] * len(tasks)
        with self._lock, task_rows({self.method.name: rows}):
            features = self.base.forward_features(x)
            for name, task in served.items():
                indices = [i for i, t in enumerate(tasks) if t == name]
                picked = features[torch.tensor(indices, device=x.device)]
                for i, row in zip(indices, functional_call(self._head, self._heads(task), (picked,)).unbind(0)):
                    outputs[i] = row
        return outputs

    def memory_bytes(self) -> dict[str, int]:
        seen: set[int] = set()
        usage = {"shared": storage_bytes(self.base.parameters(), seen)}
        for name, task in self._tasks.items():
            usage[name] = storage_bytes(task.tensors.values(), seen)
        usage["total"] = sum(usage.values())
        return usage

    def __repr__(self) -> str:
        family = self.method.name if self.method else "no family yet"
        return f"AddedServer({family}, tasks={self.tasks}, default={self._default!r})"
