"""Adaptation methods: one package per family, each registering one :class:`Method` in :data:`METHODS`.

    freeze/       the freezing policies (``attn``, ``ffn+norm@8-11``, ``full``, ``head``, ``bitfit``, ``ln``) and
                  attnft's adapter format
    peft/         peft's LoRA (DoRA as an option) and IA3 on the role map's modules, in peft's format with a sidecar
    vpt/          VPT: prompt tokens at every block's input (or once)
    adaptformer/  AdaptFormer: a scaled bottleneck beside each FFN
    ssf/          SSF: a scale and shift after every op, merged at export
    added/        what the three above share (a family that adds modules to a base), for plugins too

Everything else asks the family and never which family it holds::

    tuning = parse_method(cfg.policy)       # UnknownPolicyError for a typo, before any model
    tuning.check_blocks(num_blocks, name)   # @BLOCKS the model does not have
    applied = tuning.apply(model)           # what trains, its report, what it captured of the base
    optimizer = create_optimizer_v2(applied.optimizer_params(weight_decay, layer_decay), ...)
    store.save(name, applied.model, applied.report, applied.base, record)  # in its family's format

    method = method_of(folder)              # the family whose adapter a folder is
    config = method.config(folder); module = method.load(model, folder)
    opened = method.open(folder)            # family and config read once, carried: method.read(opened) reads
                                            # the weights alone

A new family is one package (here, or anywhere: a plugin's) whose ``__init__`` calls :func:`register_method` with its
``Method``: parse, apply, defaults, save, read, verify, load, show, its folders' files and marker, its tensors'
prefixes and the multi-task model that serves it. Nothing else in attnft names it.
"""
from __future__ import annotations

from .base import AdapterFolder, AdapterSummary, Applied, Method, Tuning
from .registry import METHODS, load_plugins, method_for_spec, method_of, parse_method, register_method, spec_help
from . import adaptformer, peft, ssf, vpt, freeze  # noqa: F401,E402  (each registers its family; freeze last)

load_plugins()  # families from outside attnft: entry points "attnft.methods", $ATTNFT_METHODS

__all__ = ["METHODS", "AdapterFolder", "AdapterSummary", "Applied", "Method", "Tuning", "method_for_spec",
           "method_of", "parse_method", "register_method", "spec_help"]
