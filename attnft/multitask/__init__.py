"""The multi-task model: one frozen backbone, many adapters, mixed-task batches — the public home of each family's
server, whose own home is its family's package.

:class:`MultiTaskModel` serves attnft adapters (:mod:`attnft.methods.freeze.serving`), and through
``from_store`` / ``from_adapters`` the adapters of any family, a mix of families included
(:class:`attnft.methods.serving.MixedFamilies`); :class:`PeftMultiTask` serves peft's (loaded on first use: it
imports peft). ``attnft serve`` puts them behind HTTP: that is :mod:`attnft.server`, above this package.
"""
import importlib

# name -> the module defining it; loaded on first use, so that peft (seconds to import) loads only for PeftMultiTask
_EXPORTS = {
    "MultiTaskModel": "attnft.methods.freeze.serving.model",
    "PeftMultiTask": "attnft.methods.peft.serving",
    "TaskServer": "attnft.methods.serving",
    "MixedFamilies": "attnft.methods.serving",
    "serve_adapters": "attnft.methods.serving",
    "TaskWeights": "attnft.methods.freeze.serving.tasks",
    "Slot": "attnft.methods.freeze.serving.slots",
    "SlotKind": "attnft.methods.freeze.serving.slots",
    "find_slots": "attnft.methods.freeze.serving.slots",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
