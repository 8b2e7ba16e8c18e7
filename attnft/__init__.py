"""attnft: attention-only fine-tuning of Vision Transformers.

The public API, one import away (each name loads its home on first use, so ``import attnft`` stays cheap)::

    from attnft import create_model, apply_policy, AdapterStore, MultiTaskModel
    from attnft import finetune, FinetuneConfig, compare, CompareConfig, AttnftError

Importing attnft registers its bundled models (``vit_fmnist_patch16_224``, the default,
``vit_fmnist_patch32_224`` and ``vit_fmnist_patch4_28``) in timm's registry,
without importing timm: see :mod:`attnft.registration`.
"""

from .core.lazy import lazy_names
from .core.version import __version__
from .registration import register_bundled_models

register_bundled_models()

_ERRORS = ("AttnftError", "UnknownModelError", "UnknownPolicyError", "NoAttentionError", "AdapterError",
           "BaseMismatchError", "StoreError", "DiskFullError", "DataError", "ConfigError", "OfflineError",
           "DivergedError")
# public name -> the module that defines it
_HOMES = {
    "create_model": "attnft.models",
    "apply_policy": "attnft.methods.freeze.policy",
    "Policy": "attnft.methods.freeze.policy",
    "PolicyReport": "attnft.methods.freeze.policy",
    "parse_method": "attnft.methods",
    "METHODS": "attnft.methods",
    "method_of": "attnft.methods",
    "method_for_spec": "attnft.methods",
    "register_method": "attnft.methods",
    "apply_peft_policy": "attnft.methods.peft.model",
    "AdapterStore": "attnft.adapters.store",
    "find_adapter": "attnft.adapters.store",
    "AdapterRecord": "attnft.methods.record",
    "BaseSnapshot": "attnft.methods.freeze.snapshot",
    "load_adapter": "attnft.methods.freeze.load",
    "load_peft_adapter": "attnft.methods.peft.files",
    "MultiTaskModel": "attnft.multitask",
    "PeftMultiTask": "attnft.multitask",
    "finetune": "attnft.training.runner",
    "FinetuneConfig": "attnft.training.config",
    "compare": "attnft.compare",
    "CompareConfig": "attnft.compare",
    **{name: "attnft.core.errors" for name in _ERRORS},
}

__all__ = ["__version__", *_HOMES]


__getattr__, __dir__ = lazy_names(globals(), _HOMES)
