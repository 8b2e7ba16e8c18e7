"""The registry of method families: :func:`register_method`, called once by each family's package (peft's
``register_peft_method``, timm's ``register_model``), fills :data:`METHODS` and tells the layers below what the
family owns — its adapter folders (:mod:`attnft.core.folders`, for ``--overwrite`` and ``delete``) and its tensors'
prefixes (:mod:`attnft.roles.names`, so that a checkpoint's size leaves them out). Those layers expose the hook; this
module fills it, so the imports keep running down.
"""
from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points
from typing import Optional, Union

from ..core.errors import ConfigError, UnknownPolicyError, UnknownSpecName
from ..core.parsing import short
from ..core.folders import register_adapter_folder
from ..roles import register_tensor_prefixes, tensor_prefix_owner
from .base import AdapterFolder, Method, Tuning

PLUGINS_ENV = "ATTNFT_METHODS"  # comma-separated modules that register method families (a plugin not installed)
ENTRY_POINTS = "attnft.methods"  # the entry-point group of installed plugins: each entry a module that registers

# name -> family. Specs and folders go to the first that claims them; the fallback (freeze: it claims every folder
# and its errors say what a spec or a folder lacks) stays last
METHODS: dict[str, Method] = {}
"""Every registered method family by name (``freeze``, ``peft``, ``vpt``, ``adaptformer``, ``ssf``, and plugins),
in the order a spec or a folder is offered to them; attnft's freezing policies (``freeze``) come last."""
_FALLBACK: list[Method] = []


def register_method(method: Method, *, fallback: bool = False) -> Method:
    """Register the family ``method``: its specs, folders and tensors become attnft's to train, store and serve.

    Args:
        method: the family's :class:`Method` (a ``name``, its ``folder`` kind, its tensors' ``prefixes``, ...).
        fallback: the family asked last, after every other (attnft's own freezing policies).

    Returns:
        ``method``, so that a package can write ``FAMILY = register_method(Family())``.

    Raises:
        ConfigError: a family of that name is registered, or one of its prefixes overlaps another family's.
    """
    if not isinstance(method, Method):
        raise TypeError(f"register_method takes a Method, not {type(method).__name__}")
    if method.name in METHODS:
        raise ConfigError(f"a method family named {method.name!r} is registered already: choose another name")
    for prefix in method.prefixes:
        owner = tensor_prefix_owner(prefix)
        if owner is not None:
            raise ConfigError(f"method family {method.name!r}: tensor prefix {prefix!r} overlaps family {owner!r}'s: "
                              "each family owns its tensors' prefixes")
    register_adapter_folder(method.folder)
    register_tensor_prefixes(method.name, method.prefixes)
    if fallback:
        _FALLBACK.append(method)
    ordered = [m for m in METHODS.values() if m not in _FALLBACK] + ([] if fallback else [method]) + _FALLBACK
    METHODS.clear()
    METHODS.update((m.name, m) for m in ordered)
    return method


def spec_help() -> str:
    """Every family's specs in a few words, for help texts and errors: "attn, ffn, ... (edited as in ...), lora, ia3
    (peft's, ...), ..."."""
    ordered = _FALLBACK + [method for method in METHODS.values() if method not in _FALLBACK]
    return ", ".join(method.specs for method in ordered)


MAX_SPEC_LENGTH = 256


def parse_method(spec: str) -> Tuning:
    """What policy ``spec`` trains, parsed by the family that names it.

    Imports no peft (seconds): that waits for :meth:`Tuning.apply` of a peft method.

    Args:
        spec: a ``--policy`` spec: ``attn``, ``ffn+norm@8-11``, ``lora:r=16``, ``vpt:tokens=50,deep=false``, ...

    Returns:
        The family's ``Tuning``: ``.method`` (its family), ``.family`` (its name within the family, e.g. ``lora``),
        ``.defaults`` (learning rate and warmup), and ``.apply(model)`` to put it on a model.

    Raises:
        UnknownPolicyError: no family reads ``spec``, or its family refuses it (an unknown role or option).
    """
    if isinstance(spec, str) and len(spec) > MAX_SPEC_LENGTH:  # it is stored in every adapter and printed in reports
        raise UnknownPolicyError(f"policy spec of {len(spec):,} characters: a spec is at most {MAX_SPEC_LENGTH}, "
                                 "e.g. 'attn+norm@8-11' or 'lora+ffn:r=16,alpha=32'")
    try:
        for method in METHODS.values():
            tuning = method.parse(spec)
            if tuning is not None:
                return tuning
    except UnknownSpecName:  # the fallback knows the name of none of its specs: say every family's
        raise UnknownPolicyError(f"unknown policy {short(spec, 60)!r}: choose one of {spec_help()}") from None
    raise UnknownPolicyError(f"unknown policy {spec!r}")  # not reached: the last family refuses what it cannot parse


def method_for_spec(spec: str) -> Method:
    """The family of policy ``spec``.

    Args:
        spec: a ``--policy`` spec, as :func:`parse_method` takes it.

    Returns:
        The registered ``Method`` that parses it (``METHODS[name]``).

    Raises:
        UnknownPolicyError: as :func:`parse_method`.
    """
    return parse_method(spec).method


def method_of(source: Union[str, os.PathLike, object]) -> Method:
    """The family of an adapter: a folder (told by its files, cheaply), or what a family made or read (a report, a
    config, an adapter: each names its family in ``method_name``; an :class:`AdapterFolder` carries it).

    Args:
        source: an adapter folder, or a report, config or adapter a family made or read.

    Returns:
        The registered ``Method`` whose adapter it is; for a folder no other family claims, attnft's freezing
        policies (whose ``read`` and ``verify`` then say what the folder lacks).

    Raises:
        TypeError: ``source`` is neither a path nor anything a family made.
    """
    if isinstance(source, AdapterFolder):
        return source.method  # found when it was opened
    if isinstance(source, (str, os.PathLike)):
        return next(method for method in METHODS.values() if method.detects(source))
    try:
        return METHODS[source.method_name]
    except AttributeError:
        raise TypeError(f"a {type(source).__name__} is no adapter: pass a folder, or a report, config or adapter "
                        "of a method in attnft.methods.METHODS") from None


def family_of_task(source) -> Optional[Method]:
    """The family of a task's adapter (a folder, or what a family read from one); None for tensors in memory
    (TaskWeights, a name -> tensor dict), which the fallback family's multi-task model takes as they are."""
    if isinstance(source, (str, os.PathLike)) or hasattr(source, "method_name"):
        return method_of(source)
    return None


def fallback() -> Method:
    """The family asked last (attnft's freezing policies)."""
    return _FALLBACK[0]


def load_plugins() -> None:
    """Import the modules that register method families from outside attnft: installed packages' entry points in
    the group ``attnft.methods``, then the modules named in ``$ATTNFT_METHODS`` (comma-separated, importable)."""
    for entry in entry_points(group=ENTRY_POINTS):
        entry.load()
    for name in (part.strip() for part in os.environ.get(PLUGINS_ENV, "").split(",")):
        if name:
            importlib.import_module(name)
