"""Public names loaded from their homes on first use (PEP 562), so importing a package stays cheap."""
from __future__ import annotations

import importlib
from typing import Callable


def lazy_names(namespace: dict, homes: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` for ``homes`` (public name -> the module that defines it); each
    name found is kept in ``namespace`` (the module's globals), so it is looked up once."""

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
