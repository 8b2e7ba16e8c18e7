"""The model card (``README.md``) of a peft adapter folder: Hugging Face metadata and the lines that load it with
plain peft or with attnft."""
from __future__ import annotations

from collections import Counter
from typing import Optional

from ...models import library_for_name
from ..cards import first_names
from .sidecar import PeftAdapterInfo


def peft_model_card(info: PeftAdapterInfo, *, base_model_id: Optional[str] = None, license: Optional[str] = None) -> str:
    """README.md for a peft adapter folder: hub metadata, what was trained on what, and how to load it.

    ``info.metadata`` may hold ``dataset`` (its name) and ``top1`` (accuracy in percent) to show.
    """
    from huggingface_hub import ModelCardData

    library = library_for_name(info.model_name)
    metadata = ModelCardData(
        library_name="peft",
        pipeline_tag="image-classification",
        license=license or "other",
        base_model=base_model_id or info.model_name,
        tags=["attnft", "peft", info.method, library.name, "image-classification", "vision-transformer"],
    )
    roles = ", ".join(f"{role} {count}" for role, count in sorted(Counter(info.targets.values()).items()))
    dc = info.data_config
    rows = [
        ("base model", f"`{info.model_name}`"),
        ("base fingerprint", f"`{info.base_fingerprint[:16]}...`"),
        ("policy", f"`{info.policy}`"),
        ("adapted modules", f"{len(info.targets)} ({roles})"),
        ("trained whole", ", ".join(f"`{m}`" for m in info.head_modules) or "nothing (head frozen)"),
        ("input size", f"{info.input_size} px"),
        ("classes", f"{info.num_classes} ({first_names(info.label_names)})" if info.label_names else f"{info.num_classes}"),
    ]
    if info.metadata.get("dataset"):
        rows.append(("data", f"`{info.metadata['dataset']}`"))
    if info.metadata.get("top1") is not None:
        rows.append(("top-1 accuracy", f"{info.metadata['top1']:.2f}%"))
    rows += [
        ("mean / std", f"{dc.get('mean')} / {dc.get('std')}"),
        ("peft / attnft", f"{info.peft_version} / {info.attnft_version}"),
    ]
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    return f"""---
{metadata.to_yaml()}
---

# {info.path.name}

A `{info.method}` adapter for `{info.model_name}`, made with attnft: peft's `{info.method}` on the modules that
attnft's role map gives the roles of policy `{info.policy}`, {info.trained_params:,} trained parameters. It is
in peft's own format; `attnft.json` beside it records the base's fingerprint, which attnft checks.

| | |
|---|---|
{table}

## Use with {library.name} and peft alone

{library.plain_peft_use(info)}
## Use with attnft

```python
{library.attnft_create(info, "base", classes=True)}
from attnft import load_peft_adapter  # importing attnft registers its bundled models in timm

model = load_peft_adapter(base, "path/to/this/folder")  # checks the base's fingerprint first
```
"""
