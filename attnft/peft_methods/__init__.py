"""The old public path of attnft's peft methods, kept one release for users' code: it warns, then each name loads
from its home on first use. Use ``from attnft import apply_peft_policy, load_peft_adapter, PeftMultiTask``.

Everything of peft's methods lives in one package, :mod:`attnft.methods.peft` (applying, saving and reading a
folder: :mod:`~attnft.methods.peft.files`, :mod:`~attnft.methods.peft.sidecar`); serving several is
:class:`attnft.multitask.PeftMultiTask`. Nothing inside attnft imports this module. Importing it imports no peft.
"""
from __future__ import annotations

import warnings

from ..core.lazy import lazy_names

warnings.warn("attnft.peft_methods is deprecated and will be removed in the next release: from attnft import "
              "apply_peft_policy, load_peft_adapter, PeftMultiTask (their homes: attnft.methods.peft, attnft.multitask)",
              DeprecationWarning, stacklevel=2)

# public name -> the module that defines it
_HOMES = {
    "PEFT_METHODS": "attnft.methods.peft.spec",
    "PeftMethod": "attnft.methods.peft.spec",
    "LoraOptions": "attnft.methods.peft.spec",
    "IA3Options": "attnft.methods.peft.spec",
    "PeftPolicy": "attnft.methods.peft.spec",
    "is_peft_spec": "attnft.methods.peft.spec",
    "PeftTargets": "attnft.methods.peft.targets",
    "select_targets": "attnft.methods.peft.targets",
    "modules_to_save": "attnft.methods.peft.targets",
    "adapted_modules": "attnft.methods.peft.targets",
    "PeftReport": "attnft.methods.peft.model",
    "apply_peft_policy": "attnft.methods.peft.model",
    "param_groups": "attnft.methods.peft.model",
    "no_decay_names": "attnft.methods.peft.model",
    "SIDECAR_FILE": "attnft.methods.peft.sidecar",
    "SIDECAR_FORMAT": "attnft.methods.peft.sidecar",
    "SIDECAR_VERSION": "attnft.methods.peft.sidecar",
    "PeftAdapterInfo": "attnft.methods.peft.sidecar",
    "is_peft_adapter": "attnft.methods.peft.sidecar",
    "read_peft_adapter": "attnft.methods.peft.sidecar",
    "save_peft_adapter": "attnft.methods.peft.files",
    "verify_peft_adapter": "attnft.methods.peft.files",
    "load_peft_adapter": "attnft.methods.peft.files",
    "peft_model_card": "attnft.methods.peft.card",
}

__all__ = list(_HOMES)


__getattr__, __dir__ = lazy_names(globals(), _HOMES)
