"""Adaptation methods: one package per family, each registering one :class:`Method` in :data:`METHODS`.

    freeze/   the freezing policies (``attn``, ``ffn+norm@8-11``, ``full``, ``head``) and attnft's adapter format
    peft/     peft's LoRA and IA3 on the role map's modules, in peft's format with attnft's sidecar

Everything else asks the family and never which family it holds::

    tuning = parse_method(cfg.policy)       # UnknownPolicyError for a typo, before any model
    tuning.check_blocks(num_blocks, name)   # @BLOCKS the model does not have
    applied = tuning.apply(model)           # what trains, its report, what it captured of the base
    optimizer = create_optimizer_v2(applied.optimizer_params(weight_decay, layer_decay), ...)
    store.save(name, applied.model, applied.report, applied.base, record)  # in its family's format

    method = method_of(folder)              # the family whose adapter a folder is
    config = method.config(folder); module = method.load(model, folder)

A new family is one package here (its ``Method``: parse, apply, defaults, save, read, verify, load, the
multi-task model that serves it, show) and one entry in :data:`METHODS`.
"""
from __future__ import annotations

import os
from typing import Union

from ..core.errors import UnknownPolicyError
from .base import AdapterSummary, Applied, Method, Tuning
from .freeze.method import FREEZE
from .peft.method import PEFT

# name -> family. Specs and folders go to the first that claims them; freeze comes last, the fallback whose
# errors say what a spec or an adapter folder lacks (its policies' message names the peft methods too)
METHODS: dict[str, Method] = {method.name: method for method in (PEFT, FREEZE)}

MAX_SPEC_LENGTH = 256


def parse_method(spec: str) -> Tuning:
    """What policy ``spec`` trains, parsed by the family that names it; UnknownPolicyError for anything else.

    Imports no peft (seconds): that waits for :meth:`Tuning.apply` of a peft method.
    """
    if isinstance(spec, str) and len(spec) > MAX_SPEC_LENGTH:  # it is stored in every adapter and printed in reports
        raise UnknownPolicyError(f"policy spec of {len(spec):,} characters: a spec is at most {MAX_SPEC_LENGTH}, "
                                 "e.g. 'attn+norm@8-11' or 'lora+ffn:r=16,alpha=32'")
    for method in METHODS.values():
        tuning = method.parse(spec)
        if tuning is not None:
            return tuning
    raise UnknownPolicyError(f"unknown policy {spec!r}")  # not reached: the last family refuses what it cannot parse


def method_for_spec(spec: str) -> Method:
    """The family of policy ``spec``."""
    return parse_method(spec).method


def method_of(source: Union[str, os.PathLike, object]) -> Method:
    """The family of an adapter: a folder (told by its files, cheaply), or what a family made or read (a report, a
    config, an adapter: each names its family in ``method_name``)."""
    if isinstance(source, (str, os.PathLike)):
        return next(method for method in METHODS.values() if method.detects(source))
    try:
        return METHODS[source.method_name]
    except AttributeError:
        raise TypeError(f"a {type(source).__name__} is no adapter: pass a folder, or a report, config or adapter "
                        "of a method in attnft.methods.METHODS") from None


__all__ = ["METHODS", "AdapterSummary", "Applied", "Method", "Tuning", "method_for_spec", "method_of",
           "parse_method"]
