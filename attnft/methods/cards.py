"""Every model card (``README.md``) attnft writes, so a folder can be pushed to a hub repo as it is: an attnft
adapter's (:func:`model_card`), a peft adapter's (:func:`peft_model_card`) and a merged export's (:func:`export_card`).

What differs by the base's library (the lines that create the base, with attnft or alone) the base's
:class:`attnft.models.library.ModelLibrary` says.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Optional

from ..models import library_for_name
from ..models.library import PlainExport

if TYPE_CHECKING:
    from .freeze.config import AdapterConfig
    from .peft.sidecar import PeftAdapterInfo


def model_card(config: "AdapterConfig", title: str, license: Optional[str] = None) -> str:
    """README.md with Hugging Face metadata (YAML front matter) describing an adapter folder."""
    from huggingface_hub import ModelCardData

    library = library_for_name(config.model_name)
    metadata = ModelCardData(
        library_name="attnft",
        pipeline_tag="image-classification",
        license=license or "other",
        base_model=config.base_model_id or config.model_name,
        tags=["attnft", library.name, "image-classification", "vision-transformer", "attention-fine-tuning", f"policy-{config.policy}"],
    )
    dc = config.data_config
    storage = f"exact {config.dtype}" if config.mode == "exact" else f"delta {config.delta_dtype} (trained - base; head and position tables exact)"
    labels = ""
    if config.label_names:
        shown = ", ".join(f"`{n}`" for n in config.label_names[:50])
        more = f", ... ({len(config.label_names)} in all)" if len(config.label_names) > 50 else ""
        labels = f"\n## Labels\n\n{shown}{more}\n"
    return f"""---
{metadata.to_yaml()}
---

# {title}

An adapter for `{config.model_name}`, made with attnft: only the weights the `{config.policy}` policy
trains are stored ({_trained_roles(config)}), {config.trained_params:,} parameters.
It loads only onto the base it was trained on; attnft checks that by fingerprint.

| | |
|---|---|
| base model | `{config.model_name}` |
| base fingerprint | `{config.base_fingerprint[:16]}...` |
| policy | `{config.policy}` |
| storage | {storage} |
| input size | {config.input_size} px |
| classes | {config.num_classes} |
| mean / std | {dc.get('mean')} / {dc.get('std')} |
| crop / interpolation | {dc.get('crop_pct')} {dc.get('crop_mode', '')} / {dc.get('interpolation')} |
| timm / attnft | {config.timm_version} / {config.attnft_version} |

## Use with {library.name} alone

{library.plain_adapter_use(config)}
## Use with attnft

```python
{library.attnft_create(config, "model", classes=False)}
from attnft import load_adapter  # importing attnft registers its bundled models in timm

load_adapter(model, "path/to/this/folder")  # checks the base's fingerprint, sets the head and input size
model.eval()
```

`attnft adapters pull ORG/REPO NAME` stores a verified copy; `attnft adapters export NAME --out DIR`
merges it into the base as a folder plain {library.name} loads.
{labels}"""


def _trained_roles(config: "AdapterConfig") -> str:
    """The roles the adapter's tensors have, as the role map named them at save time: 'attention, head, pos_embed'."""
    roles = dict.fromkeys(entry["role"] for entry in config.tensors.values() if entry.get("role"))
    return ", ".join(roles) or "no tensor"


def peft_model_card(info: "PeftAdapterInfo", *, base_model_id: Optional[str] = None, license: Optional[str] = None) -> str:
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
        ("classes", f"{info.num_classes} ({_first_names(info.label_names)})" if info.label_names else f"{info.num_classes}"),
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


def _first_names(names: list, shown: int = 10) -> str:
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
