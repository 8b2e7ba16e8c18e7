"""A database URL as attnft writes or prints it: never with its password (``postgresql://bob:***@db/attnft``).

The study's URL (``--storage``) may carry a password; the report's command line, the error lines and anything
else a comparison writes or prints show it masked, as SQLAlchemy renders a URL with ``hide_password``.
"""
from __future__ import annotations

import re
from typing import Optional

# what SQLAlchemy reads as the password: after the user's "name:", up to the "@" before the host
_PASSWORD = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^/:@]*:)(?P<password>[^@]*)@")


def safe_url(url: str) -> str:
    """``url`` without its password (``***`` in its place); a text SQLAlchemy cannot read as a URL is masked alike."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads (a bad port, ...): its password masked where it would be
        return _PASSWORD.sub(r"\g<head>***@", url)


def password_of(url: str) -> Optional[str]:
    """The password ``url`` holds (None: none)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).password or None
    except Exception:
        found = _PASSWORD.search(url)
        return found.group("password") or None if found else None


def masked(text: str, url: str) -> str:
    """``text`` (a database's error message, a command line) with ``url``'s password masked wherever it appears."""
    password = password_of(url)
    text = _PASSWORD.sub(r"\g<head>***@", text)
    return text.replace(password, "***") if password and len(password) >= 4 else text  # "a": not every a


def masked_argv(argv: list[str]) -> list[str]:
    """A command line with the password of every URL in it masked (``--storage URL``, ``--storage=URL``)."""
    return [_PASSWORD.sub(r"\g<head>***@", arg) if "://" in arg else arg for arg in argv]
