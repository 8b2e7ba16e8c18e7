"""transformers as a :class:`attnft.models.library.ModelLibrary`: ``transformers:ORG/REPO`` and ``save_pretrained`` folders.

Building is :func:`attnft.models.hf_models.create_transformers_model`. A merged export is what
``save_pretrained`` writes, plus the image processor::

    config.json                 the model's config at the adapter's size (image_size) and classes (id2label)
    model.safetensors           the merged weights, transformers' own names
    preprocessor_config.json    the base's processor, resized for the adapter's input size

so that, with nothing but transformers installed::

    model = AutoModelForImageClassification.from_pretrained(DIR)   # or "ORG/REPO" once pushed
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from torch import nn

from ..core.errors import AdapterError
from .hf_config import patch_side
from .hf_models import PREFIX, PROCESSOR_FILE, TimmInterface, create_transformers_model, no_progress_bars
from .library import ModelLibrary, PlainExport


@dataclass
class TransformersExport(PlainExport):
    """A transformers export: where it went, and the class plain transformers builds it as."""

    architecture: str = ""  # e.g. ViTForImageClassification
    model: Optional[nn.Module] = field(default=None, repr=False)
    processor: dict = field(default_factory=dict)
    library = "transformers"

    def load_source(self, folder: Optional[str] = None) -> str:
        return ("from transformers import AutoModelForImageClassification\n\n"
                f"model = AutoModelForImageClassification.from_pretrained({str(folder or self.folder)!r}).eval()\n")

    def write(self, folder: Path) -> None:
        with no_progress_bars():
            self.model.save_pretrained(str(folder), safe_serialization=True)
        (folder / PROCESSOR_FILE).write_text(json.dumps(self.processor, indent=2) + "\n")

    def card_made_of(self) -> str:
        return f"`{self.architecture}`"

    def card_about(self) -> str:
        return """`config.json` and `preprocessor_config.json` are what `save_pretrained` writes; pushed to a hub
repository, it loads the same way with `AutoModelForImageClassification.from_pretrained("ORG/REPO")`.
"""


class TransformersLibrary(ModelLibrary):
    """transformers' image classifiers behind timm's interface (:mod:`attnft.models.hf_models`)."""

    name = "transformers"

    def claims_name(self, name: str) -> bool:
        """``transformers:...``, or a folder ``save_pretrained`` wrote (timm's config.json has an architecture instead)."""
        if name.startswith(PREFIX):
            return True
        config = Path(name) / "config.json"
        if not config.is_file():
            return False
        try:
            data = json.loads(config.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and "model_type" in data and "architecture" not in data

    def claims_model(self, model: nn.Module) -> bool:
        return isinstance(model, TimmInterface)

    def build(self, name, options) -> nn.Module:
        return create_transformers_model(name, **options)

    def patch_grid(self, model: nn.Module) -> Optional[tuple[int, int]]:
        side = model.img_size // patch_side(model.config)
        return side, side

    def attnft_create(self, base, var: str, classes: bool) -> str:
        sizes = f"num_classes={base.num_classes}, img_size={base.input_size}" if classes else f"img_size={base.input_size}"
        return f'from attnft import create_model\n\n{var} = create_model("{base.model_name}", {sizes})'

    def plain_adapter_use(self, base) -> str:
        """At another size than the base's, the base is rebuilt at the adapter's size with each position
        embedding resampled by the model's own ``interpolate_pos_encoding``, as attnft resampled it
        (``from_pretrained(..., image_size=N, ignore_mismatched_sizes=True)`` would start it random)."""
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
    {_hub_source(base.model_name)!r}, num_labels=config["num_classes"], ignore_mismatched_sizes=True,
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

    def plain_peft_use(self, base) -> str:
        return f"""```python
from peft import PeftModel
from transformers import AutoModelForImageClassification

base = AutoModelForImageClassification.from_pretrained({_hub_source(base.model_name)!r})
model = PeftModel.from_pretrained(base, "path/to/this/folder").eval()
logits = model(pixel_values, interpolate_pos_encoding=True).logits  # pixel_values: (B, 3, {base.input_size}, {base.input_size})
```

`interpolate_pos_encoding=True` resamples the base's position embedding to the adapter's
{base.input_size} px, as attnft did when it trained it; preprocessing: `data_config` in `attnft.json`.
"""

    def plan_export(self, model, folder, data_config, label_names) -> TransformersExport:
        if label_names:
            if len(label_names) != model.num_classes:
                raise AdapterError(f"{len(label_names)} label names for a model with {model.num_classes} classes")
            model.config.id2label = {i: str(name) for i, name in enumerate(label_names)}
            model.config.label2id = {str(name): i for i, name in enumerate(label_names)}
        processor = export_processor(model.image_processor, model.img_size, data_config)
        return TransformersExport(folder=folder, architecture=type(model).__name__, model=model, processor=processor)


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


def _hub_source(model_name: str) -> str:
    """What ``from_pretrained`` takes for ``model_name``: the name without ``transformers:``."""
    return model_name[len(PREFIX):] if model_name.startswith(PREFIX) else model_name


TRANSFORMERS = TransformersLibrary()

__all__ = ["TRANSFORMERS", "TransformersLibrary", "TransformersExport", "export_processor"]
