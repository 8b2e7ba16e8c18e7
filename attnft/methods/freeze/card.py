"""The model card (``README.md``) of an attnft adapter folder, so it can be pushed to a hub repo as it is: Hugging
Face metadata, what trained, and the lines that load it (with attnft, or into plain timm after export)."""
from __future__ import annotations

from typing import Optional

from ...models import library_for_name
from .config import AdapterConfig


def model_card(config: AdapterConfig, title: str, license: Optional[str] = None) -> str:
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


def _trained_roles(config: AdapterConfig) -> str:
    """The roles the adapter's tensors have, as the role map named them at save time: 'attention, head, pos_embed'."""
    roles = dict.fromkeys(entry["role"] for entry in config.tensors.values() if entry.get("role"))
    return ", ".join(roles) or "no tensor"
