"""Multi-task serving: one frozen backbone, many adapters, mixed-task batches.

Layout: :mod:`.slots` finds where each task's state lives (from the role map),
:mod:`.tasks` holds a task's own tensors, :mod:`.routing` answers each call with the right
task's modules, :mod:`.model` is the API for attnft adapters (:class:`MultiTaskModel`),
:mod:`.peft_serving` the same API for peft adapters (:class:`PeftMultiTask`, loaded on first
use: it imports peft), and :mod:`.serving` what the two share (:class:`TaskServer`).

``attnft serve`` puts them behind HTTP: :mod:`.catalog` watches the store, :mod:`.pager` keeps
adapters loaded within a memory budget, :mod:`.batcher` forms mixed-task batches from one bounded
queue, :mod:`.inputs` turns request bodies into tensors, :mod:`.http` is the Starlette app,
:mod:`.metrics` its Prometheus metrics, :mod:`.service` puts them together (:mod:`.config` its flags).
"""
import importlib

# name -> the module defining it; loaded on first use, so that `attnft.multitask.config` (the serve
# command's flags) needs no torch, and peft (seconds to import) loads only for PeftMultiTask
_EXPORTS = {
    "MultiTaskModel": ".model",
    "PeftMultiTask": ".peft_serving",
    "TaskServer": ".serving",
    "TaskWeights": ".tasks",
    "Slot": ".slots",
    "SlotKind": ".slots",
    "find_slots": ".slots",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
