"""A spec of a family that adds modules: ``NAME``, ``NAME:KEY=VALUE,...`` and ``@BLOCKS``, e.g. ``vpt:tokens=50``,
``adaptformer:dim=32@6-11``; each option typed by the family's options dataclass and checked by its
``__post_init__``."""
from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from typing import Any, Optional

from ...core.errors import AttnftError, UnknownPolicyError
from ...core.parsing import ascii_float, ascii_int, base_type, parse_bool, short
from ..specs import parse_blocks

_SPEC = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::([^@]*))?(?:@(.*))?\s*")


@dataclass(frozen=True)
class AddedPolicy:
    """What a spec of the family asks: its options and blocks, and the spec as given (``name``)."""

    name: str
    family: str
    options: Any  # the family's options dataclass
    blocks: Optional[frozenset[int]] = None

    @classmethod
    def parse(cls, spec: str, family: str, options_cls: type) -> Optional["AddedPolicy"]:
        """The policy, or None when ``spec`` is not ``family``'s; UnknownPolicyError when it is and is wrong."""
        if not isinstance(spec, str):
            return None
        match = _SPEC.fullmatch(spec)
        if match is None or match.group(1) != family:
            return None
        options_text, blocks_text = match.group(2), match.group(3)
        if blocks_text is not None and not blocks_text.strip():
            raise UnknownPolicyError(f"policy {short(spec, 60)!r} has no blocks after '@': name them as in "
                                     f"'{family}@8-11'")
        options = _options(options_cls, options_text or "", spec)
        blocks = parse_blocks(blocks_text, spec) if blocks_text else None
        return cls(spec.strip(), family, options, blocks)


def _options(options_cls: type, text: str, spec: str):
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    hints = typing.get_type_hints(options_cls)
    values: dict[str, Any] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or key not in fields:
            known = ", ".join(fields) or "none"
            raise UnknownPolicyError(f"policy {short(spec, 60)!r}: unknown option {short(item, 30)!r} "
                                     f"(options: {known}, as in KEY=VALUE)")
        if key in values:
            raise UnknownPolicyError(f"policy {short(spec, 60)!r} sets {key} twice")
        kind = base_type(hints[key])[0]
        try:
            values[key] = {bool: parse_bool, int: ascii_int, float: ascii_float}.get(kind, str)(raw.strip())
        except ValueError:
            raise UnknownPolicyError(f"policy {short(spec, 60)!r}: {key}={short(raw, 20)!r} is not a "
                                     f"{kind.__name__}") from None
    try:
        return options_cls(**values)
    except (ValueError, AttnftError) as e:
        raise UnknownPolicyError(f"policy {short(spec, 60)!r}: {e}") from None
