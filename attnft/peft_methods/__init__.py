"""peft's methods (LoRA, IA3) on the modules the role map calls attention.

peft users target timm models with hand-written names or regexes: ``proj`` also matches
``patch_embed.proj``, and ``layers_to_transform`` does not see timm's root-level ``blocks.N``.
Here the role map picks the targets: every leaf module whose weights are all attention
(FFN, or both, on request), by its full dotted name, and the classifier is trained whole
alongside (peft's ``modules_to_save``). A policy spec reads like the freezing policies::

    lora                      LoRA on every attention module, r=8, alpha=16; the head trains
    lora:r=16,alpha=32,dropout=0.1
    lora+ffn                  attention and FFN modules
    lora+ffn-attn             FFN modules only
    lora@8-11                 attention modules of blocks 8..11 (modules outside blocks keep theirs)
    lora-head                 the head stays frozen
    ia3, ia3+ffn              (IA)^3 scaling vectors; FFN modules scale their input

Options by method: ``lora``: r, alpha, dropout, bias (none | lora_only), dora, rslora;
``ia3``: none. Modules a method cannot wrap (norms, LoRA on grouped convolutions) and
attention weights held directly by a non-leaf module (relative position tables, BEiT's
``q_bias``) stay frozen; the report lists them.

Adapters are saved in peft's own format (``adapter_config.json`` + ``adapter_model.safetensors``,
readable by plain ``PeftModel.from_pretrained``) plus a sidecar ``attnft.json`` with the base
fingerprint and what attnft needs to rebuild the base (model name, input size, classes), so
attnft refuses an adapter trained on another base. peft's config loader warns about keys it
does not know ("saved with a newer peft"), hence the sidecar rather than extra keys in its
JSON. attnft's own adapters use the same two file names; ``attnft.json`` tells them apart.

Layout, as peft lays out a method: :mod:`.spec` (the *what*: options, the peft config, the
policy spec), :mod:`.targets` (the *where*: the role map's modules), :mod:`.model` (applying,
the report, optimizer groups), :mod:`.sidecar` (``attnft.json``, read without peft) and
:mod:`.files` (save, verify, load, model card). Several adapters on one base are served by
:class:`attnft.multitask.peft_serving.PeftMultiTask`. Whether a policy is a peft method at all
is decided in one place, :func:`attnft.methods.parse_method`.

The names below load on first use: importing this package imports no peft (seconds).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it
_HOMES = {
    "PEFT_METHODS": ".spec",
    "PeftMethod": ".spec",
    "LoraOptions": ".spec",
    "IA3Options": ".spec",
    "PeftPolicy": ".spec",
    "is_peft_spec": ".spec",
    "PeftTargets": ".targets",
    "select_targets": ".targets",
    "modules_to_save": ".targets",
    "adapted_modules": ".targets",
    "PeftReport": ".model",
    "apply_peft_policy": ".model",
    "param_groups": ".model",
    "no_decay_names": ".model",
    "SIDECAR_FILE": ".sidecar",
    "SIDECAR_FORMAT": ".sidecar",
    "SIDECAR_VERSION": ".sidecar",
    "PeftAdapterInfo": ".sidecar",
    "is_peft_adapter": ".sidecar",
    "read_peft_adapter": ".sidecar",
    "save_peft_adapter": ".files",
    "verify_peft_adapter": ".files",
    "load_peft_adapter": ".files",
    "peft_model_card": ".files",
    "PeftMultiTask": "..multitask.peft_serving",
}

__all__ = list(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


if TYPE_CHECKING:  # for type checkers and editors; at run time __getattr__ loads them
    from ..multitask.peft_serving import PeftMultiTask  # noqa: F401
    from .files import load_peft_adapter, peft_model_card, save_peft_adapter, verify_peft_adapter  # noqa: F401
    from .model import PeftReport, apply_peft_policy, no_decay_names, param_groups  # noqa: F401
    from .sidecar import SIDECAR_FILE, SIDECAR_FORMAT, SIDECAR_VERSION, PeftAdapterInfo, is_peft_adapter, read_peft_adapter  # noqa: F401
    from .spec import PEFT_METHODS, IA3Options, LoraOptions, PeftMethod, PeftPolicy, is_peft_spec  # noqa: F401
    from .targets import PeftTargets, adapted_modules, modules_to_save, select_targets  # noqa: F401
