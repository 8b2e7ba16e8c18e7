"""Everything one ``attnft serve`` process holds, built from a :class:`ServeConfig` and checked at start-up.

The store's catalog, the pager with one backbone per base, the batcher, the preprocessing
and its thread pool, the metrics. Start-up refuses, with one line, what cannot work: a
``--tasks`` name the store lacks, an empty store, a ``--device`` that is not there, bases of
which none can be created, and a ``--memory-budget`` below the backbones plus the largest adapter.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import torch

from ..core.errors import ConfigError
from ..core.parsing import format_bytes
from .batcher import Batcher
from .catalog import StoreCatalog, TaskEntry
from .config import ServeConfig
from .inputs import Preprocessor
from .metrics import ServeMetrics
from .pager import AdapterPager

DTYPES = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LISTED_TASKS = 50  # start-up lines beyond this are summed up in one


class Service:
    """Catalog, pager, batcher, preprocessing and metrics of one server."""

    def __init__(self, config: ServeConfig):
        from ..adapters.store import AdapterStore

        self.config = config
        self.metrics = ServeMetrics()
        self.catalog = StoreCatalog(AdapterStore(config.store), config.task_names)
        entries = self.catalog.check_start()
        _check_checkpoint(config.checkpoint, entries)
        self.pager = AdapterPager(self.catalog, budget=config.memory_budget_bytes, device=_device(config.device),
                                  dtype=DTYPES[config.precision], checkpoint=config.checkpoint, metrics=self.metrics)
        self.catalog.on_change = self.pager.retire  # a folder that changed or went away: unload the version loaded
        self._create_backbones(entries)
        self._check_budget(entries)
        self.metrics.budget_bytes.set(config.memory_budget_bytes or 0)
        self.batcher = Batcher(self.pager, max_batch=config.max_batch, max_wait_s=config.max_wait_ms / 1000,
                               max_queue=config.max_queue, metrics=self.metrics)
        self.preprocessor = Preprocessor()
        self.executor = ThreadPoolExecutor(config.workers, thread_name_prefix="attnft-decode")
        self.max_body = config.max_body_bytes
        self.body_timeout = config.body_timeout

    def _create_backbones(self, entries: list[TaskEntry]) -> None:
        keys = list(dict.fromkeys(entry.base for entry in entries if entry.base is not None))
        for key in keys:
            self.pager.add_backbone(key)
        if keys and not self.pager.backbones:
            raise ConfigError(next(iter(self.pager.backbone_errors.values())))

    def _check_budget(self, entries: list[TaskEntry]) -> None:
        budget = self.pager.budget
        if budget is None:
            return
        backbones = sum(b.bytes for b in self.pager.backbones.values())
        largest = max((self.pager.estimate(e) for e in entries if e.base in self.pager.backbones), default=0)
        if backbones + largest > budget:
            raise ConfigError(
                f"--memory-budget {format_bytes(budget)} cannot hold the backbones ({format_bytes(backbones)}) and the "
                f"largest adapter ({format_bytes(largest)}): give at least {format_bytes(backbones + largest)}"
            )

    # --- what request handlers call ---------------------------------------------------------

    async def run(self, function: Callable, *args):
        """``function(*args)`` in the thread pool (store lookups, decoding), off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    def preprocess(self, data: bytes, data_config: dict, which: str) -> torch.Tensor:
        started = time.monotonic()
        tensor = self.preprocessor(data, data_config, which)
        self.metrics.preprocess_seconds.observe(time.monotonic() - started)
        return tensor

    def task_info(self, entry: TaskEntry) -> dict:
        """One task of ``GET /v1/tasks``."""
        base = entry.base
        loaded = self.pager.loaded_bytes(entry.name)
        reason = self.pager.failure(entry)
        return {
            "name": entry.name,
            "base": base.model_name if base else None,
            "input_size": base.input_size if base else None,
            "format": entry.format_name or None,
            "classes": entry.num_classes,
            "labels": list(entry.label_names) if entry.label_names else None,
            "weights_sha256": entry.weights_sha256 or None,
            "loaded": loaded is not None,
            "memory_bytes": loaded if loaded is not None else self.pager.estimate(entry),
            "status": "unavailable" if reason else "ok",
            "error": reason,
        }

    def describe(self, url: str) -> list[str]:
        """The start-up lines: where, the bases and their memory, every task with its base and memory."""
        entries = self.catalog.refresh()
        budget = self.pager.budget
        lines = [f"attnft serve: {url}  ({len(entries)} tasks, {len(self.pager.backbones)} backbones, "
                 f"{self.pager.device}, {str(self.pager.dtype).replace('torch.', '')}, memory budget "
                 f"{format_bytes(budget) if budget else 'none'})"]
        for key, backbone in self.pager.backbones.items():
            lines.append(f"  base {key.describe()}: {format_bytes(backbone.bytes)}")
        lines.extend(f"  {reason}" for reason in self.pager.backbone_errors.values())
        for entry in entries[:LISTED_TASKS]:
            info = self.task_info(entry)
            where = f"{info['base']} at {info['input_size']} px, {info['format']}" if entry.base else "unreadable"
            state = info["error"] or f"{format_bytes(info['memory_bytes'])}, loads on first use"
            lines.append(f"  task {entry.name}  ({where}, {entry.num_classes} classes): {state}")
        if len(entries) > LISTED_TASKS:
            lines.append(f"  ... and {len(entries) - LISTED_TASKS} more tasks (GET /v1/tasks lists them all)")
        return lines

    def close(self) -> None:
        """Answer every queued image, stop the model's thread and the pool (at shutdown)."""
        self.batcher.stop()
        self.executor.shutdown(wait=True)


SERVING_DEVICES = ("cpu", "cuda", "mps")


def _device(name: Optional[str]) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {name!r} is not a device: use cpu, cuda or cuda:N") from None
    if device.type not in SERVING_DEVICES:
        raise ConfigError(f"--device {name}: attnft serves on {', '.join(SERVING_DEVICES)} (a {device.type} device "
                          "holds no weights it can compute with here)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {name}: no MPS device is available here")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: no CUDA device is available here")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA devices")
    return device


def _check_checkpoint(checkpoint: Optional[str], entries: list[TaskEntry]) -> None:
    if checkpoint is None:
        return
    models = sorted({entry.base.model_name for entry in entries if entry.base is not None})
    if len(models) > 1:
        raise ConfigError(f"--checkpoint is the weights of one base, and these adapters name {', '.join(models)}: "
                          "pass --tasks to serve the adapters of one of them")
