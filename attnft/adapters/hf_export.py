"""Merge an adapter into its transformers base and export a folder plain transformers loads.

The export is what ``save_pretrained`` writes, plus the image processor::

    config.json                 the model's config at the adapter's size (image_size) and classes (id2label)
    model.safetensors           the merged weights, transformers' own names
    preprocessor_config.json    the base's processor, resized for the adapter's input size
    README.md                   a model card with the lines that load it

so that, with nothing but transformers installed::

    model = AutoModelForImageClassification.from_pretrained(DIR)   # or "ORG/REPO" once pushed

:func:`attnft.adapters.merge.export_adapter` merges an adapter and writes this folder when its base is a
transformers model (timm's checkpoint folder otherwise).
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from torch import nn

from ..core.errors import AdapterError
from ..core.files import CARD_FILE as EXPORT_CARD, EXPORT_FOLDER, PathLike, check_replaceable_folder, write_directory_atomically
from ..models.hf_models import PROCESSOR_FILE, is_transformers_model, no_progress_bars

if TYPE_CHECKING:
    from .config import AdapterConfig



@dataclass
class TransformersExport:
    """Where an export went, and the class plain transformers builds it as."""

    folder: Path
    architecture: str  # e.g. ViTForImageClassification
    library = "transformers"

    def load_source(self, folder: Optional[str] = None) -> str:
        """Python source that loads the export with transformers alone (``folder``: the path to show)."""
        return ("from transformers import AutoModelForImageClassification\n\n"
                f"model = AutoModelForImageClassification.from_pretrained({str(folder or self.folder)!r}).eval()\n")


def export_merged(
    model: nn.Module,
    out_dir: PathLike,
    *,
    data_config: Optional[dict] = None,
    label_names: Optional[list[str]] = None,
    title: Optional[str] = None,
    overwrite: bool = False,
) -> TransformersExport:
    """Write ``model`` (a transformers base with an adapter loaded) as a ``save_pretrained`` folder, atomically."""
    if not is_transformers_model(model):
        raise AdapterError(f"{type(model).__name__} was not made by attnft.models.hf_models: export it with attnft.adapters.merge")
    out_dir = Path(out_dir)
    check_replaceable_folder(out_dir, overwrite, EXPORT_FOLDER)
    if label_names:
        if len(label_names) != model.num_classes:
            raise AdapterError(f"{len(label_names)} label names for a model with {model.num_classes} classes")
        model.config.id2label = {i: str(name) for i, name in enumerate(label_names)}
        model.config.label2id = {str(name): i for i, name in enumerate(label_names)}
    result = TransformersExport(folder=out_dir, architecture=type(model).__name__)
    processor = export_processor(model.__dict__["_attnft_source"]["processor"], model.img_size, data_config or {})

    def write(folder: Path) -> None:
        with no_progress_bars():
            model.save_pretrained(str(folder), safe_serialization=True)
        (folder / PROCESSOR_FILE).write_text(json.dumps(processor, indent=2) + "\n")
        (folder / EXPORT_CARD).write_text(_export_card(result, title or out_dir.name))

    write_directory_atomically(out_dir, write, kind=EXPORT_FOLDER, overwrite=overwrite, what=f"export {out_dir.name}")
    return result


def export_processor(processor: dict, size: int, data_config: dict) -> dict:
    """The base's image processor config for inputs of ``size`` px (a ViT processor from ``data_config`` if it has none)."""
    out = copy.deepcopy(processor)
    if not out:
        out = {"image_processor_type": "ViTImageProcessor", "do_resize": True, "resample": 3, "do_rescale": True,
               "rescale_factor": 1 / 255, "do_normalize": True,
               "image_mean": list(data_config.get("mean", (0.5, 0.5, 0.5))),
               "image_std": list(data_config.get("std", (0.5, 0.5, 0.5)))}
    old = out.get("size")
    if isinstance(old, dict) and "shortest_edge" in old and out.get("do_center_crop"):
        crop_pct = float(data_config.get("crop_pct") or 1.0)
        out["size"] = {"shortest_edge": round(size / crop_pct)}
        out["crop_size"] = {"height": size, "width": size}
    elif isinstance(old, dict) and "shortest_edge" in old:
        out["size"] = {"shortest_edge": size}
    elif out.get("do_center_crop") and out.get("crop_size") is not None:  # DeiT's: resize to height/width, crop
        crop_pct = float(data_config.get("crop_pct") or 1.0)
        side = round(size / crop_pct)
        out["size"] = {"height": side, "width": side}
        out["crop_size"] = {"height": size, "width": size}
    else:
        out["size"] = {"height": size, "width": size}
        if out.get("crop_size") is not None:
            out["crop_size"] = {"height": size, "width": size}
    return out


def plain_transformers_use(config: "AdapterConfig") -> str:
    """A model card's section that loads an adapter on its transformers base with transformers and safetensors, no attnft.

    At another size than the base's, the base is rebuilt at the adapter's size with each position
    embedding resampled by the model's own ``interpolate_pos_encoding``, as attnft resampled it
    (``from_pretrained(..., image_size=N, ignore_mismatched_sizes=True)`` would start it random).
    """
    base = _base_source(config.model_name)
    return f"""The adapter holds only what training changed: create the base it was trained on at its size and
classes, then copy each stored tensor in (values, or a delta from the base, as `adapter_config.json` lists them):

```python
import json

import torch
from safetensors.torch import load_file
from transformers import AutoModelForImageClassification

folder = "path/to/this/folder"
config = json.load(open(f"{{folder}}/adapter_config.json"))
size = config["input_size"]
model = AutoModelForImageClassification.from_pretrained(
    {base!r}, num_labels=config["num_classes"], ignore_mismatched_sizes=True,
).float()
vision = getattr(model.config, "vision_config", model.config)  # CLIP keeps its image size there
if vision.image_size != size:
    # the base at the adapter's size, each position embedding resampled by the model's own
    # interpolate_pos_encoding (what model(x, interpolate_pos_encoding=True) does, and attnft did)
    owners = {{path: m for path, m in model.named_modules() if hasattr(m, "interpolate_pos_encoding")}}
    state = model.state_dict()
    vision.image_size = size
    resized = type(model)(model.config)
    for name, tensor in resized.state_dict().items():
        if state[name].shape != tensor.shape:
            owner = next((m for path, m in owners.items() if name.startswith(path + ".")), None)
            if owner is None:  # e.g. BEiT's relative position tables, which attnft resamples as timm does
                raise ValueError(f"{{name}} follows the input size: use the merged export (attnft adapters export)")
            with torch.no_grad():
                resampled = owner.interpolate_pos_encoding(torch.zeros(1, *tensor.shape[-2:]), size, size)
            state[name] = resampled.reshape(tensor.shape)
    resized.load_state_dict(state)
    model = resized
state = model.state_dict()  # shares memory with the model's parameters
for name, stored in load_file(f"{{folder}}/adapter_model.safetensors").items():
    target = state[name]
    target.copy_(target.float() + stored.float() if config["tensors"][name]["stored"] == "delta" else stored)
model.eval()  # model(pixel_values).logits; preprocessing: config["data_config"] (mean, std, input_size)
```
"""


def plain_peft_use(info) -> str:
    """A peft adapter card's section that loads it on its transformers base with transformers and peft, no attnft
    (``info``: its :class:`attnft.peft_methods.PeftAdapterInfo`)."""
    base = _base_source(info.model_name)
    return f"""```python
from peft import PeftModel
from transformers import AutoModelForImageClassification

base = AutoModelForImageClassification.from_pretrained({base!r})
model = PeftModel.from_pretrained(base, "path/to/this/folder").eval()
logits = model(pixel_values, interpolate_pos_encoding=True).logits  # pixel_values: (B, 3, {info.input_size}, {info.input_size})
```

`interpolate_pos_encoding=True` resamples the base's position embedding to the adapter's
{info.input_size} px, as attnft did when it trained it; preprocessing: `data_config` in `attnft.json`.
"""


def _base_source(model_name: str) -> str:
    from ..models.hf_models import PREFIX

    return model_name[len(PREFIX):] if model_name.startswith(PREFIX) else model_name


def _export_card(result: TransformersExport, title: str) -> str:
    from huggingface_hub import ModelCardData

    metadata = ModelCardData(library_name="transformers", pipeline_tag="image-classification", license="other",
                             tags=["transformers", "image-classification", "attnft"])
    return f"""---
{metadata.to_yaml()}
---

# {title}

A `{result.architecture}` checkpoint with an attnft adapter merged in. Load it with transformers alone (no attnft):

```python
{result.load_source("path/to/this/folder")}```

`config.json` and `preprocessor_config.json` are what `save_pretrained` writes; pushed to a hub
repository, it loads the same way with `AutoModelForImageClassification.from_pretrained("ORG/REPO")`.
"""
