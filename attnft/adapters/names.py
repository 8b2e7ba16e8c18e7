"""Adapter names: what a name in a store may be, and how a name made from long parts stays valid and distinct.

Names are ``[A-Za-z0-9][A-Za-z0-9._-]*`` without ``..``, at most :data:`MAX_NAME_LENGTH` characters, so a name can
never reach outside the store. :func:`fit_name` builds one from parts (a model, a policy, a dataset): when they are
too long it shortens the part that can be shortened and appends a hash of the whole, so two names made from
different parts never collide however long the parts are.
"""
from __future__ import annotations

import hashlib
import re

from ..core.errors import StoreError

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NAME_LENGTH = 128
DIGEST_LENGTH = 8  # hex digits of the sha256 that a shortened name ends with


def is_valid_name(name) -> bool:
    """Whether ``name`` is an adapter name: one folder directly in the store, never a path out of it."""
    return isinstance(name, str) and bool(NAME_PATTERN.fullmatch(name)) and ".." not in name and len(name) <= MAX_NAME_LENGTH


def check_name(name: str) -> str:
    """``name`` if it is a valid adapter name, else StoreError."""
    if not is_valid_name(name):
        raise StoreError(
            f"invalid adapter name {name!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit, "
            f"no '..', at most {MAX_NAME_LENGTH} characters"
        )
    return name


def fit_name(parts: list[str], shorten: int, room: int = 0) -> str:
    """``parts`` joined by '-', within ``MAX_NAME_LENGTH - room`` characters (``room``: what a caller appends later,
    e.g. ``-seed9``). Too long, ``parts[shorten]`` is cut and ``-`` and the first :data:`DIGEST_LENGTH` hex digits of
    the whole name's sha256 appended: names of different parts stay different.

    Args:
        parts: the name's parts, each already in the name's characters.
        shorten: the index of the part that may be cut (a dataset's name, say; not the policy).
        room: characters kept free at the end.
    Returns:
        The name.
    """
    limit = MAX_NAME_LENGTH - room
    name = "-".join(parts)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:DIGEST_LENGTH]
    over = len(name) + 1 + DIGEST_LENGTH - limit
    cut = parts[shorten][:max(len(parts[shorten]) - over, 1)]
    short = "-".join([*parts[:shorten], cut, *parts[shorten + 1:], digest])
    if len(short) > limit:  # the other parts alone are too long: cut the whole
        short = name[:limit - 1 - DIGEST_LENGTH] + "-" + digest
    return re.sub(r"\.{2,}", ".", short)
