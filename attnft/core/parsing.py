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

from .files import why_not_a_file
from .errors import ConfigError

TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")


class TaskDefault:
    """The default of a field the quick demo sets and every other run leaves None (see
    :data:`attnft.training.config.DEFAULT_TASK_SETTINGS`): not None, so that an explicit None still means "all"."""

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


NAMED_COLOURS = {"white": (255, 255, 255), "black": (0, 0, 0)}


def parse_background(text: str):
    """The colour a transparent pixel becomes: ``white``, ``black``, ``R,G,B`` (0-255 each) as a tuple,
    or ``"mean"`` (the base's normalisation mean, resolved with the model); ValueError otherwise."""
    word = text.strip().lower()
    if word in NAMED_COLOURS:
        return NAMED_COLOURS[word]
    if word == "mean":
        return word
    parts = word.split(",")
    if len(parts) == 3 and all(p.strip().isascii() and p.strip().isdigit() and int(p) <= 255 for p in parts):
        return tuple(int(p) for p in parts)
    raise ValueError(f"background must be white, black, mean or R,G,B with each 0-255, got {text[:40]!r}")


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


def check_split_spec(name: str, split) -> None:
    """ConfigError unless ``split`` (None, or split names joined by ``+``) names distinct, non-empty splits:
    ``train+train`` would show every image twice an epoch."""
    if split is None:
        return
    parts = [part.strip() for part in split.split("+")]
    if not all(parts):
        raise ConfigError(f"{name} {split[:60]!r} has an empty part: join split names as in 'train+validation'")
    twice = sorted({part for part in parts if parts.count(part) > 1})
    if twice:
        raise ConfigError(f"{name} {split[:60]!r} names {', '.join(twice)} twice: each image would be seen twice an epoch")


def max_workers() -> int:
    """The most data loader workers a run may start: 4 per core (a million would hang starting them)."""
    return 4 * (os.cpu_count() or 1)


def ascii_int(text: str) -> int:
    """``int(text)`` for ASCII digits only (Python's ``int`` also reads ``"٣"`` as 3; argparse users expect ASCII)."""
    if not str(text).isascii():
        raise ValueError(f"invalid int value: {text!r}")
    return int(text)


ascii_int.__name__ = "int"  # argparse names the type in its message: "invalid int value: '٣'"


def ascii_float(text: str) -> float:
    """``float(text)`` for ASCII text only (``float("١.٥")`` is 1.5)."""
    if not str(text).isascii():
        raise ValueError(f"invalid float value: {text!r}")
    return float(text)


ascii_float.__name__ = "float"


def option(default: Any, help: str, *, choices: tuple | None = None, group: str = "", metavar: str | None = None) -> Any:
    """A config field with the help text (and choices, group, metavar) of its flag (:func:`add_config_arguments`)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "group": group, "metavar": metavar})


def add_config_arguments(parser: argparse.ArgumentParser, config_cls: type, recipe: bool = True,
                         exclude: frozenset[str] = frozenset()) -> None:
    """One flag per field of ``config_cls`` (``--field-name``) but those in ``exclude``, grouped, plus ``--recipe FILE``.

    Flags default to "not given" so that :func:`config_from_args` can tell an explicit value
    from a default and let it override the recipe.
    """
    if recipe:
        parser.add_argument("--recipe", metavar="FILE", help="YAML file of field: value (flags override it)")
    hints = typing.get_type_hints(config_cls)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(config_cls):
        if f.name in exclude:
            continue
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
            groups[name].add_argument(flag, nargs=2, type=ascii_float, metavar=("LOW", "HIGH"), **common)
        else:
            metavar = f.metadata.get("metavar") or ("N" if kind is int else "X" if kind is float else None)
            parse = {int: ascii_int, float: ascii_float}.get(kind, kind)
            groups[name].add_argument(flag, type=parse, choices=f.metadata.get("choices"), metavar=metavar, **common)


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


MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of key: value lines; beyond this it is not one
MAX_RECIPE_DEPTH = 20  # nesting of lists/mappings: a recipe's values are flat or a pair of numbers


def load_recipe(path: str, config_cls: type) -> dict[str, Any]:
    """The key: value pairs of a YAML recipe, checked against the fields of ``config_cls``.

    Read strictly (:class:`_RecipeLoader`): no aliases (a few bytes of nested ``*refs`` expand to
    gigabytes), no key twice, no deep nesting, at most :data:`MAX_RECIPE_BYTES`; a scalar keeps
    the text it was written as, so ``name: 0x1F`` is the name ``0x1F``, not 31.
    """
    import yaml

    why = why_not_a_file(path)
    if why is not None:
        raise ConfigError(f"recipe {path} {'not found' if why == 'does not exist' else why}: pass a YAML file")
    try:
        if os.path.getsize(path) > MAX_RECIPE_BYTES:
            raise ConfigError(f"recipe {path} is over {MAX_RECIPE_BYTES >> 20} MB: a recipe is a list of key: value lines")
        with open(path, encoding="utf-8") as f:
            values = yaml.load(f, Loader=_recipe_loader())
    except UnicodeDecodeError as e:
        raise ConfigError(f"recipe {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
                          "save it as UTF-8") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {path} is not valid YAML: {short(' '.join(str(e).split()), 300)}") from None
    except RecursionError:
        raise ConfigError(f"recipe {path} nests deeper than {MAX_RECIPE_DEPTH} levels") from None
    except OSError as e:
        raise ConfigError(f"recipe {path} cannot be read: {e.strerror or e}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"recipe {path} must be a mapping of field: value, found {type(values).__name__}")
    _check_keys(config_cls, values, f"recipe {path}")
    return values


def short(value: Any, limit: int = 80) -> str:
    """``value``'s repr (a string: itself) cut to ``limit`` characters, for echoing user input in one line."""
    import reprlib

    if isinstance(value, str):
        text = value
    else:
        cut = reprlib.Repr()
        cut.maxlevel, cut.maxlist, cut.maxdict, cut.maxstring, cut.maxother = 2, 4, 4, limit, limit
        text = cut.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _recipe_loader():
    """A SafeLoader that refuses aliases, duplicate keys and deep nesting, and keeps each scalar's text."""
    import yaml

    class RecipeLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.constructor.ConstructorError(
                    None, None, f"aliases (*{event.anchor}) are not allowed in a recipe: write the value out",
                    event.start_mark)
            self._depth = getattr(self, "_depth", 0) + 1
            try:
                if self._depth > MAX_RECIPE_DEPTH:
                    raise RecursionError
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {short(key, 40)!r} appears twice: keep one", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    for tag in ("int", "float"):
        RecipeLoader.add_constructor(f"tag:yaml.org,2002:{tag}", _keeping_text(tag))
    return RecipeLoader


class _RecipeInt(int):
    text: str


class _RecipeFloat(float):
    text: str


def _keeping_text(tag: str):
    import yaml

    base = yaml.SafeLoader.yaml_constructors[f"tag:yaml.org,2002:{tag}"]
    kind = _RecipeInt if tag == "int" else _RecipeFloat

    def construct(loader, node):
        value = kind(base(loader, node))
        value.text = node.value  # what the recipe says, for a text field
        return value

    return construct


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
            raise ConfigError(f"unknown key {short(key, 60)!r} in {source}{hint}")


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
            return ascii_int(value) if isinstance(value, str) else int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            return ascii_float(value) if isinstance(value, str) else float(value)
        if kind is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return getattr(value, "text", None) or str(value)  # a recipe's 0x1F stays "0x1F"
    except (TypeError, ValueError):
        pass
    else:
        return value
    expected = {tuple: "two numbers", bool: "true or false"}.get(kind, kind.__name__)
    raise ConfigError(f"{name} must be {expected}, got {short(value) if not isinstance(value, str) else repr(short(value))}")


def _exactly(kind: type, value: Any) -> Any:
    if not isinstance(value, kind):
        raise ValueError
    return value
