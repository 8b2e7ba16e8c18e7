"""The model card (``README.md``) of a merged export, and what the families' cards share. Each family writes its
adapters' own card (:mod:`attnft.methods.freeze.card`, :mod:`attnft.methods.peft.card`), so a folder can be pushed
to a hub repo as it is.

What differs by the base's library (the lines that create the base, with attnft or alone) the base's
:class:`attnft.models.library.ModelLibrary` says.
"""
from __future__ import annotations

from ..models.library import PlainExport


def first_names(names: list, shown: int = 10) -> str:
    """The first ``shown`` of ``names``, comma-separated, "..." after when there are more."""
    return ", ".join(map(str, names[:shown])) + (", ..." if len(names) > shown else "")


def export_card(export: PlainExport, title: str) -> str:
    """README.md for a merged export: the lines that load it with its library alone."""
    from huggingface_hub import ModelCardData

    metadata = ModelCardData(library_name=export.library, pipeline_tag="image-classification", license="other",
                             tags=[export.library, "image-classification", "attnft"])
    return f"""---
{metadata.to_yaml()}
---

# {title}

A {export.card_made_of()} checkpoint with an attnft adapter merged in. Load it with {export.library} alone (no attnft):

```python
{export.card_code()}```

{export.card_about()}"""
