"""Backbones and loaded adapters within a memory budget: load on first use, unload the least recently used.

One backbone per :class:`attnft.server.catalog.BaseKey` (a :class:`MultiTaskModel` for
attnft adapters, a :class:`PeftMultiTask` per peft method), created at start-up and kept.
Adapters are loaded into their backbone's server when a batch first needs them; to make room,
the least recently used adapters that the batch does not need are unloaded. Every method but
:meth:`AdapterPager.retire` and the read-only ones runs on the model's thread, between model
calls, so an adapter is never unloaded under a running batch.

Memory is tensor storage (:meth:`TaskServer.memory_bytes`): each backbone once, each loaded
adapter its own tensors. Before loading, an adapter is counted as its trained parameters at
the serving dtype.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch

from ..core.errors import AttnftError, first_line
from ..core.parsing import format_bytes
from ..methods.serving import storage_bytes, tensors_of
from .catalog import BaseKey, StoreCatalog, TaskEntry, UnknownTask

if TYPE_CHECKING:
    from .metrics import ServeMetrics
    from ..methods.serving import TaskServer

logger = logging.getLogger(__name__)
LOAD_ATTEMPTS = 3  # a folder replaced while it was being loaded is loaded again


@dataclass
class Backbone:
    """One base model and the server holding its loaded adapters."""

    key: BaseKey
    server: "TaskServer"
    bytes: int


@dataclass
class Loaded:
    """An adapter loaded in its backbone: the version read, and the bytes it takes."""

    entry: TaskEntry
    backbone: Backbone
    bytes: int


@dataclass
class Acquired:
    """What :meth:`AdapterPager.acquire` could do for a batch: loaded tasks and failures (reason); a task in neither
    did not fit beside the others and waits for a later round."""

    loaded: dict[str, Loaded] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class AdapterPager:
    """Loaded adapters of every backbone, least recently used first, within ``budget`` bytes (None: no limit)."""

    def __init__(self, catalog: StoreCatalog, *, budget: Optional[int], device: torch.device, dtype: torch.dtype,
                 checkpoint: Optional[str] = None, metrics: Optional["ServeMetrics"] = None):
        self.catalog = catalog
        self.budget = budget
        self.device, self.dtype = device, dtype
        self.checkpoint = checkpoint
        self.metrics = metrics
        self.backbones: dict[BaseKey, Backbone] = {}
        self.backbone_errors: dict[BaseKey, str] = {}
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()  # least recently used first
        self._failed: dict[str, tuple[int, str]] = {}  # name -> (version, why it cannot be served)
        self._retired: set[str] = set()
        self._lock = threading.Lock()  # guards _failed and _retired, which request threads read and write

    # --- read from any thread -------------------------------------------------------------

    def failure(self, entry: TaskEntry) -> Optional[str]:
        """Why ``entry`` cannot be served, if that is known already (its config, its base, or a failed load)."""
        if entry.error is not None:
            return f"adapter {entry.name} cannot be served: {entry.error}"
        if entry.base in self.backbone_errors:
            return self.backbone_errors[entry.base]
        with self._lock:
            failed = self._failed.get(entry.name)
        return failed[1] if failed is not None and failed[0] >= entry.version else None

    def loaded_count(self) -> int:
        return len(self._loaded)

    def loaded_bytes(self, name: str) -> Optional[int]:
        loaded = self._loaded.get(name)
        return loaded.bytes if loaded is not None else None

    def resident_bytes(self) -> int:
        return sum(b.bytes for b in self.backbones.values()) + sum(t.bytes for t in list(self._loaded.values()))

    def estimate(self, entry: TaskEntry) -> int:
        """Bytes ``entry`` will take once loaded: its trained parameters at the serving dtype."""
        return entry.trained_params * torch.empty((), dtype=self.dtype).element_size()

    def retire(self, name: str) -> None:
        """``name`` changed in the store or went away: unload it before the next batch (any thread)."""
        with self._lock:
            self._retired.add(name)

    # --- on the model's thread --------------------------------------------------------------

    def add_backbone(self, key: BaseKey) -> Optional[Backbone]:
        """The backbone of ``key``, created on first call; None (and the reason kept) if it cannot be created."""
        if key in self.backbones or key in self.backbone_errors:
            return self.backbones.get(key)
        try:
            self.backbones[key] = _create_backbone(key, self.checkpoint, self.device, self.dtype)
        except AttnftError as e:
            self.backbone_errors[key] = f"base {key.describe()} cannot be loaded: {' '.join(str(e).split())}"
            logger.warning(self.backbone_errors[key])
            return None
        self._update_gauges()
        return self.backbones[key]

    def acquire(self, entries: list[TaskEntry]) -> Acquired:
        """Load what the tasks of ``entries`` (one per task, in batch order) need, as far as the budget allows.

        Tasks that do not fit beside those already acquired are in neither field: run what was loaded,
        then call again with them. The first task always fits (the budget holds the
        backbones and the largest adapter, checked at start-up), unless its own base does not.
        """
        self._drop_retired()
        result = Acquired()
        pinned: set[str] = set()
        for entry in entries:
            loaded = self._loaded.get(entry.name)
            if loaded is None or loaded.entry.version < entry.version:
                outcome = self._load(entry, pinned)
                if outcome is None:  # it does not fit now: a later round
                    continue
                if isinstance(outcome, str):
                    result.failed[entry.name] = outcome
                    continue
                loaded = outcome
            if loaded.entry.base != entry.base:
                result.failed[entry.name] = f"adapter {entry.name} changed its base while the request waited: retry"
                continue
            self._loaded.move_to_end(entry.name)
            pinned.add(entry.name)
            result.loaded[entry.name] = loaded
        return result

    def _load(self, entry: TaskEntry, pinned: set[str]):
        """Loaded, or a reason (str) it cannot be, or None when it does not fit beside ``pinned`` now."""
        reason = self.failure(entry)  # found while the request waited (another's load of this version failed)
        if reason is not None:
            return reason
        if entry.name in self._loaded:
            self._unload(entry.name, evicted=False)  # an older version
        new_base = entry.base not in self.backbones
        backbone = self.add_backbone(entry.base)
        if backbone is None:
            return self.backbone_errors[entry.base]
        if not self._make_room(self.estimate(entry), pinned):
            if pinned:
                return None  # after the batch's other tasks have run
            if new_base:  # a base that appeared while serving, too large for the budget beside the others
                del self.backbones[entry.base]
                self.backbone_errors[entry.base] = (f"base {entry.base.describe()} ({format_bytes(backbone.bytes)}) does "
                                                    "not fit in --memory-budget beside the other backbones")
                self._update_gauges()
                return self.backbone_errors[entry.base]
            return f"adapter {entry.name} does not fit in --memory-budget beside the backbones"
        current = entry  # the version the request looked up, its family and config as read then
        for attempt in range(LOAD_ATTEMPTS):
            if attempt:  # its folder changed since it was read: the newest version
                try:
                    current = self.catalog.get(entry.name)
                except UnknownTask as e:
                    return str(e)
                if current.base != entry.base or current.error is not None:
                    return self.failure(current) or f"adapter {entry.name} changed its base while the request waited: retry"
            outcome = self._add(current, backbone)
            if outcome is not None:
                return outcome
        return f"adapter {entry.name} keeps changing in the store: retry"

    def _add(self, entry: TaskEntry, backbone: Backbone):
        """Loaded, or a reason (str) it cannot be; None when its folder changed while it was read (or since the
        request looked it up): not this version, then. Its folder is looked at once, after the read."""
        try:
            backbone.server.add_task(entry.name, entry.folder)  # the weights, against the config the entry holds
        except Exception as e:  # noqa: BLE001  whatever a broken folder makes a library raise, it stays this task's
            if not self.catalog.unchanged(entry):
                return None  # replaced while being read: read the new one
            if not isinstance(e, AttnftError):
                logger.exception("loading adapter %s", entry.name)
            return self._fail(entry, f"adapter {entry.name} cannot be served: {first_line(e)}")
        if not self.catalog.unchanged(entry):
            backbone.server.remove_task(entry.name)
            return None
        loaded = Loaded(entry, backbone, backbone.server.memory_bytes().get(entry.name, self.estimate(entry)))
        self._loaded[entry.name] = loaded
        if self.metrics is not None:
            self.metrics.loads.inc()
        self._update_gauges()
        return loaded

    def _make_room(self, needed: int, pinned: set[str]) -> bool:
        """Unload least recently used adapters outside ``pinned`` until ``needed`` more bytes fit."""
        if self.budget is None:
            return True
        while self.resident_bytes() + needed > self.budget:
            victim = next((name for name in self._loaded if name not in pinned), None)
            if victim is None:
                return False
            self._unload(victim, evicted=True)
        return True

    def _unload(self, name: str, *, evicted: bool) -> None:
        loaded = self._loaded.pop(name)
        loaded.backbone.server.remove_task(name)
        if evicted and self.metrics is not None:
            self.metrics.evictions.inc()
        self._update_gauges()

    def _fail(self, entry: TaskEntry, reason: str) -> str:
        logger.warning(reason)
        with self._lock:
            self._failed[entry.name] = (entry.version, reason)
        return reason

    def _drop_retired(self) -> None:
        with self._lock:
            retired, self._retired = self._retired, set()
        for name in retired:
            if name in self._loaded:
                current = self.catalog.current(name)
                if current is None or current.version > self._loaded[name].entry.version:
                    self._unload(name, evicted=False)

    def _update_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.adapters_loaded.set(len(self._loaded))
            self.metrics.resident_bytes.set(self.resident_bytes())


def _create_backbone(key: BaseKey, checkpoint: Optional[str], device: torch.device, dtype: torch.dtype) -> Backbone:
    """The base of ``key`` with its pretrained weights (or ``checkpoint``), on ``device`` in ``dtype``, and its server."""
    from ..models import create_model

    base = create_model(key.model_name, checkpoint=checkpoint, img_size=key.input_size).eval()
    server = key.method.server(base)
    server.base_fingerprint  # of the float32 weights the adapters were trained on: a bf16 copy hashes to another
    base.to(device=device, dtype=dtype)  # in place: the server's base, now at the serving dtype
    return Backbone(key, server, storage_bytes(tensors_of(base)))
