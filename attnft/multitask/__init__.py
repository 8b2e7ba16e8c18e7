"""Multi-task serving: one frozen backbone, many attention adapters, mixed-task batches.

Layout: :mod:`.slots` finds where each task's state lives (from the role map),
:mod:`.tasks` holds a task's own tensors, :mod:`.routing` answers each call with the right
task's modules, :mod:`.model` is the API (:class:`MultiTaskModel`).
"""
from .model import MultiTaskModel
from .slots import Slot, SlotKind, find_slots
from .tasks import TaskWeights

__all__ = ["MultiTaskModel", "TaskWeights", "Slot", "SlotKind", "find_slots"]
