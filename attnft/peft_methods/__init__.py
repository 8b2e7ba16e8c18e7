"""The old public path of attnft's peft methods, kept one release for users' code: it warns, then each name loads
from its home on first use. Use ``from attnft import apply_peft_policy, load_peft_adapter, PeftMultiTask``.

Applying peft to a model is tuning (:mod:`attnft.tuning.peft`); saving and reading a peft adapter folder is the
adapter layer's (:mod:`attnft.adapters.peft_files`, :mod:`attnft.adapters.peft_sidecar`); serving several is
:class:`attnft.multitask.PeftMultiTask`. Nothing inside attnft imports this module. Importing it imports no peft.
"""
from __future__ import annotations

import warnings

from ..core.lazy import lazy_names

warnings.warn("attnft.peft_methods is deprecated and will be removed in the next release: from attnft import "
              "apply_peft_policy, load_peft_adapter, PeftMultiTask (their homes: attnft.tuning.peft, attnft.adapters)",
              DeprecationWarning, stacklevel=2)

# public name -> the module that defines it
_HOMES = {
    "PEFT_METHODS": "attnft.tuning.peft.spec",
    "PeftMethod": "attnft.tuning.peft.spec",
    "LoraOptions": "attnft.tuning.peft.spec",
    "IA3Options": "attnft.tuning.peft.spec",
    "PeftPolicy": "attnft.tuning.peft.spec",
    "is_peft_spec": "attnft.tuning.peft.spec",
    "PeftTargets": "attnft.tuning.peft.targets",
    "select_targets": "attnft.tuning.peft.targets",
    "modules_to_save": "attnft.tuning.peft.targets",
    "adapted_modules": "attnft.tuning.peft.targets",
    "PeftReport": "attnft.tuning.peft.model",
    "apply_peft_policy": "attnft.tuning.peft.model",
    "param_groups": "attnft.tuning.peft.model",
    "no_decay_names": "attnft.tuning.peft.model",
    "SIDECAR_FILE": "attnft.adapters.peft_sidecar",
    "SIDECAR_FORMAT": "attnft.adapters.peft_sidecar",
    "SIDECAR_VERSION": "attnft.adapters.peft_sidecar",
    "PeftAdapterInfo": "attnft.adapters.peft_sidecar",
    "is_peft_adapter": "attnft.adapters.peft_sidecar",
    "read_peft_adapter": "attnft.adapters.peft_sidecar",
    "save_peft_adapter": "attnft.adapters.peft_files",
    "verify_peft_adapter": "attnft.adapters.peft_files",
    "load_peft_adapter": "attnft.adapters.peft_files",
    "peft_model_card": "attnft.adapters.cards",
}

__all__ = list(_HOMES)


__getattr__, __dir__ = lazy_names(globals(), _HOMES)
