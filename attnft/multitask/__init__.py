"""Multi-task serving: one frozen backbone, many adapters, mixed-task batches.

Layout: :mod:`.slots` finds where each task's state lives (from the role map),
:mod:`.tasks` holds a task's own tensors, :mod:`.routing` answers each call with the right
task's modules, :mod:`.model` is the API for attnft adapters (:class:`MultiTaskModel`),
:mod:`.peft_serving` the same API for peft adapters (:class:`PeftMultiTask`, loaded on first
use: it imports peft), and :mod:`.serving` what the two share (:class:`TaskServer`).
"""
from .model import MultiTaskModel
from .serving import TaskServer
from .slots import Slot, SlotKind, find_slots
from .tasks import TaskWeights

__all__ = ["MultiTaskModel", "PeftMultiTask", "TaskServer", "TaskWeights", "Slot", "SlotKind", "find_slots"]


def __getattr__(name: str):
    if name == "PeftMultiTask":  # peft takes seconds to import: only when asked for
        from .peft_serving import PeftMultiTask

        return PeftMultiTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
