"""Typed values from text: config fields as command-line flags, YAML recipes, and the coercion of both.

:func:`add_config_arguments` turns a config dataclass's fields into flags (``batch_size`` ->
``--batch-size``), :func:`load_recipe` reads a YAML recipe (flat keys, the field names), and
:func:`config_from_args` layers the two over the defaults. :func:`coerce_fields` gives every
field its declared type (YAML reads ``1e-5`` as a string); :func:`parse_bool` is the one reading
of a boolean word, for the config and for a policy's options alike. Pure: no torch, no timm.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import types
import typing
from typing import Any

from .errors import ConfigError

TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")


class TaskDefault:
    """The default of a field the quick demo sets and every other run leaves None (see
    :data:`attnft.config.DEFAULT_TASK_SETTINGS`): not None, so that an explicit None still means "all"."""

    def __repr__(self) -> str:
        return "TASK_DEFAULT"


TASK_DEFAULT = TaskDefault()


def parse_bool(text: str) -> bool:
    """True for true, yes, on, 1; False for false, no, off, 0 (any case); ValueError for anything else."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{text!r} is not a boolean: use one of {', '.join(TRUE_WORDS + FALSE_WORDS)}")


_BYTE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
               "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_bytes(text: str) -> int:
    """A size in bytes from ``2GB``, ``512MB``, ``1.5G``, ``300KiB`` or ``1048576`` (KB/MB/GB are powers of
    1000, KiB/MiB/GiB of 1024); ValueError for anything else, or a size below one byte."""
    word = str(text).strip().lower().replace(" ", "").replace("_", "")
    number = word.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = word[len(number):]
    try:
        value = float(number) * _BYTE_UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not a size: use e.g. 2GB, 512MB, 300KiB or a number of bytes") from None
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"{text!r} is not a size of at least one byte")
    return int(value)


def format_bytes(size: int) -> str:
    """``1234567`` -> ``1.23 MB`` (powers of 1000, as :func:`parse_bytes` reads MB)."""
    for unit, scale in (("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size} B"


def add_config_arguments(parser: argparse.ArgumentParser, config_cls: type, recipe: bool = True) -> None:
    """One flag per field of ``config_cls`` (``--field-name``), grouped, plus ``--recipe FILE``.

    Flags default to "not given" so that :func:`config_from_args` can tell an explicit value
    from a default and let it override the recipe.
    """
    if recipe:
        parser.add_argument("--recipe", metavar="FILE", help="YAML file of field: value (flags override it)")
    hints = typing.get_type_hints(config_cls)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(config_cls):
        name = f.metadata.get("group") or "options"
        if name not in groups:
            groups[name] = parser.add_argument_group(name)
        kind, _ = base_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        default_text = _default_text(f)
        help_text = f.metadata.get("help", "") + (f" (default: {default_text})" if default_text else "")
        common = dict(dest=f.name, default=argparse.SUPPRESS, help=help_text)
        if kind is bool:
            groups[name].add_argument(flag, action=argparse.BooleanOptionalAction, **common)
        elif kind is tuple:
            groups[name].add_argument(flag, nargs=2, type=float, metavar=("LOW", "HIGH"), **common)
        else:
            metavar = f.metadata.get("metavar") or ("N" if kind is int else "X" if kind is float else None)
            groups[name].add_argument(flag, type=kind, choices=f.metadata.get("choices"), metavar=metavar, **common)


def config_from_args(config_cls: type, args: argparse.Namespace):
    """``config_cls`` from its defaults, then ``args.recipe`` (if any), then the flags given."""
    values: dict[str, Any] = {}
    source = "command line"
    recipe = getattr(args, "recipe", None)
    if recipe:
        values.update(load_recipe(recipe, config_cls))
        source = f"recipe {recipe} or the command line"
    names = {f.name for f in dataclasses.fields(config_cls)}
    values.update({k: v for k, v in vars(args).items() if k in names})
    return from_dict(config_cls, values, source)


def load_recipe(path: str, config_cls: type) -> dict[str, Any]:
    """The key: value pairs of a YAML recipe, checked against the fields of ``config_cls``."""
    import yaml

    if not os.path.isfile(path):
        raise ConfigError(f"recipe {path} not found")
    try:
        with open(path, encoding="utf-8") as f:
            values = yaml.safe_load(f)
    except UnicodeDecodeError as e:
        raise ConfigError(f"recipe {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
                          "save it as UTF-8") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {path} is not valid YAML: {' '.join(str(e).split())}") from None
    except OSError as e:
        raise ConfigError(f"recipe {path} cannot be read: {e.strerror or e}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"recipe {path} must be a mapping of field: value, found {type(values).__name__}")
    _check_keys(config_cls, values, f"recipe {path}")
    return values


def from_dict(config_cls: type, values: dict[str, Any], source: str):
    """``config_cls(**values)``; an unknown key or a bad value is a ConfigError naming ``source``."""
    _check_keys(config_cls, values, source)
    try:
        return config_cls(**values)
    except ConfigError as e:
        raise ConfigError(f"{e} (in {source})") from None


def _check_keys(config_cls: type, values: dict[str, Any], source: str) -> None:
    names = [f.name for f in dataclasses.fields(config_cls)]
    for key in values:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown key {key!r} in {source}{hint}")


def base_type(hint) -> tuple[type, bool]:
    """(int, True) for Optional[int]; tuple for tuple[float, float]."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional, hint = True, args[0]
    origin = typing.get_origin(hint)
    return (origin if origin is not None else hint), optional


def _default_text(f: dataclasses.Field) -> str:
    if f.default is dataclasses.MISSING or f.default is None or isinstance(f.default, (bool, TaskDefault)):
        return ""
    if isinstance(f.default, tuple):
        return " ".join(f"{v:g}" for v in f.default)
    return str(f.default)


def coerce_fields(config) -> None:
    """Give every field its declared type: YAML reads ``1e-5`` as a string and ``1`` where a float is meant."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        kind, optional = base_type(hints[f.name])
        if value is None:
            if not optional:
                raise ConfigError(f"{f.name} must not be empty")
            continue
        value = _coerce(f.name, value, kind)
        if kind in (float, tuple) and not all(math.isfinite(v) for v in (value if kind is tuple else (value,))):
            raise ConfigError(f"{f.name} must be a finite number, got {value if kind is float else list(value)}")
        setattr(config, f.name, value)


def _coerce(name: str, value: Any, kind: type) -> Any:
    try:
        if kind is bool:
            return parse_bool(value) if isinstance(value, str) else _exactly(bool, value)
        if kind is tuple:
            if not isinstance(value, (list, tuple)) or len(value) != 2:
                raise ValueError
            return tuple(float(v) for v in value)
        if kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        pass
    else:
        return value
    expected = {tuple: "two numbers", bool: "true or false"}.get(kind, kind.__name__)
    raise ConfigError(f"{name} must be {expected}, got {value!r}")


def _exactly(kind: type, value: Any) -> Any:
    if not isinstance(value, kind):
        raise ValueError
    return value
