"""The model card (``README.md``) of an attnft adapter folder, so the folder can be pushed to a hub repo as it is."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..core.errors import AdapterError
from ..models.hf_models import is_transformers_name

if TYPE_CHECKING:
    from .config import AdapterConfig


def model_card(config: "AdapterConfig", title: str, license: Optional[str] = None) -> str:
    """README.md with Hugging Face metadata (YAML front matter) describing an adapter folder."""
    from huggingface_hub import ModelCardData

    metadata = ModelCardData(
        library_name="attnft",
        pipeline_tag="image-classification",
        license=license or "other",
        base_model=config.base_model_id or config.model_name,
        tags=["attnft", _library(config), "image-classification", "vision-transformer", "attention-fine-tuning", f"policy-{config.policy}"],
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

## Use with {_library(config)} alone

{_plain_use(config)}
## Use with attnft

{_attnft_use(config)}
`attnft adapters pull ORG/REPO NAME` stores a verified copy; `attnft adapters export NAME --out DIR`
merges it into the base as a folder plain {_library(config)} loads.
{labels}"""


def _attnft_use(config: "AdapterConfig") -> str:
    """The card's section that loads the adapter with attnft: timm creates a timm base, attnft a transformers one."""
    if is_transformers_name(config.model_name):
        create = f"""from attnft.models import create_model

model = create_model("{config.model_name}", img_size={config.input_size})"""
    else:
        create = f"""import timm

model = timm.create_model("{config.model_name}", pretrained=True)"""
    return f"""```python
{create}
from attnft.adapters import load_adapter  # importing attnft registers its bundled models in timm

load_adapter(model, "path/to/this/folder")  # checks the base's fingerprint, sets the head and input size
model.eval()
```
"""


# the lines of a card that copy an adapter into a base with timm and safetensors alone
_PLAIN_LOAD = """state = model.state_dict()  # shares memory with the model's parameters
for name, stored in load_file(f"{folder}/adapter_model.safetensors").items():
    entry, target = config["tensors"][name], state[name]
    if entry["region"]:
        region = entry["region"]
        target = target.narrow(region["dim"], region["start"], region["stop"] - region["start"])
    target.copy_(target.float() + stored.float() if entry["stored"] == "delta" else stored)
model.eval()
transform = timm.data.create_transform(**config["data_config"])
"""


def _trained_roles(config: "AdapterConfig") -> str:
    """The roles the adapter's tensors have, as the role map named them at save time: 'attention, head, pos_embed'."""
    roles = dict.fromkeys(entry["role"] for entry in config.tensors.values() if entry.get("role"))
    return ", ".join(roles) or "no tensor"


def _library(config: "AdapterConfig") -> str:
    """The library that builds the adapter's base: transformers or timm."""
    return "transformers" if is_transformers_name(config.model_name) else "timm"


def _plain_use(config: "AdapterConfig") -> str:
    """The card's section that loads the adapter with the base's library alone (and safetensors), no attnft."""
    from ..models.plain_timm import base_build

    if is_transformers_name(config.model_name):  # a transformers base: no timm needed
        from .hf_export import plain_transformers_use

        return plain_transformers_use(config)

    try:
        build = base_build(config.model_name, config.model_args, config.num_classes, config.input_size)
    except AdapterError as e:
        return f"Plain timm cannot create this base: {e}.\n"
    return f"""The adapter holds only what training changed: create the base it was trained on, then copy each
stored tensor in (a whole weight or a slice of one, as values or as a delta from the base, as
`adapter_config.json` lists them):

```python
import json

import timm
from safetensors.torch import load_file

folder = "path/to/this/folder"
config = json.load(open(f"{{folder}}/adapter_config.json"))
model = {build.create_call()}
{_PLAIN_LOAD}```
{build.weights_note()}"""
