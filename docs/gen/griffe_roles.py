"""A griffe extension for the Python reference: attnft's docstrings cross-reference in Sphinx's roles
(``:class:`Method```, ``:func:`finetune```, ``:mod:`.routing```), which Markdown would show as a colon, a word
and a colon before the code; each becomes the code span it names."""
from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):`~?\.?([^`]+)`")


class SphinxRoles(griffe.Extension):
    """``:class:`X``` -> ```X```, in every docstring the reference renders."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(r"`\1`", obj.docstring.value)
