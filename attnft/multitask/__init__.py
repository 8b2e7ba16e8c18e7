"""The multi-task model: one frozen backbone, many adapters, mixed-task batches.

Layout: :mod:`.slots` finds where each task's state lives (from the role map),
:mod:`.tasks` holds a task's own tensors, :mod:`.routing` answers each call with the right
task's modules, :mod:`.model` is the API for attnft adapters (:class:`MultiTaskModel`),
:mod:`.peft_model` the same API for peft adapters (:class:`PeftMultiTask`, loaded on first
use: it imports peft), and :mod:`.base` what the two share (:class:`TaskServer`).

``attnft serve`` puts them behind HTTP: that is :mod:`attnft.server`, above this package.
"""
import importlib

# name -> the module defining it; loaded on first use, so that peft (seconds to import) loads only for PeftMultiTask
_EXPORTS = {
    "MultiTaskModel": ".model",
    "PeftMultiTask": ".peft_model",
    "TaskServer": ".base",
    "TaskWeights": ".tasks",
    "Slot": ".slots",
    "SlotKind": ".slots",
    "find_slots": ".slots",
}

__all__ = [*_EXPORTS, "server_for"]


def server_for(method) -> type:
    """The multi-task model class that serves many adapters of ``method`` (an :class:`attnft.methods.Method`,
    which names it) on one base."""
    return __getattr__(method.multitask)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
