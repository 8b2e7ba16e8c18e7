"""timm as a :class:`attnft.models.library.ModelLibrary`: every name transformers does not claim.

Building is :func:`attnft.models.sources.create_timm_model`; what plain timm, without attnft, needs
to build a base again is :mod:`attnft.models.plain_timm`; a merged export is timm's own hub layout
(what ``timm.models.push_to_hf_hub`` writes)::

    model.safetensors   the merged state dict, native timm keys
    config.json         architecture: a name plain timm registers; model_args: every argument that
                        builds the model (img_size, num_classes, and for attnft's bundled ViT its
                        patch_size, embed_dim, depth, num_heads, mlp_ratio); pretrained_cfg: mean,
                        std, crop_pct, interpolation, input_size, label_names

so that, with nothing but timm installed::

    model = timm.create_model("local-dir:DIR", pretrained=True)   # or "hf-hub:ORG/REPO" once pushed

A model that plain timm cannot rebuild (an argument JSON cannot hold, a name only another
package registers) is refused before anything is written.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from torch import nn

from ..core.errors import AdapterError
from ..core.files import EXPORT_CONFIG, EXPORT_WEIGHTS
from .library import ModelLibrary, PlainExport
from .plain_timm import TimmBuild, base_build, describe_model
from .sources import create_timm_model

# the keys of a data config that describe preprocessing (input_size follows the model itself)
DATA_KEYS = ("mean", "std", "crop_pct", "crop_mode", "interpolation")

# the lines of a card that copy an adapter into a base with timm and safetensors alone
_PLAIN_LOAD = """state = model.state_dict()  # shares memory with the model's parameters
for name, stored in load_file(f"{folder}/adapter_model.safetensors").items():
    entry, target = config["tensors"][name], state[name]
    if entry["region"]:
        region = entry["region"]
        target = target.narrow(region["dim"], region["start"], region["stop"] - region["start"])
    target.copy_(target.float() + stored.float() if entry["stored"] == "delta" else stored)
model.eval()
transform = timm.data.create_transform(**timm.data.resolve_data_config(config["data_config"]))
"""


@dataclass
class ExportResult(PlainExport):
    """A timm export: where it went and what plain timm builds it as."""

    build: TimmBuild = None  # architecture and model_args, as config.json holds them
    model: Optional[nn.Module] = field(default=None, repr=False)
    data_config: dict = field(default_factory=dict)
    label_names: Optional[list[str]] = None
    library = "timm"

    @property
    def weights(self) -> Path:
        return self.folder / EXPORT_WEIGHTS

    def load_source(self, folder: Optional[str] = None) -> str:
        return f"import timm\n\nmodel = timm.create_model({f'local-dir:{folder or self.folder}'!r}, pretrained=True).eval()\n"

    def write(self, folder: Path) -> None:
        from safetensors.torch import save_file
        from timm.models._hub import save_config_for_hf

        state = {name: t.detach().to("cpu").contiguous() for name, t in self.model.state_dict().items()}
        data_args = {k: v for k, v in self.data_config.items() if k in DATA_KEYS}
        model_config = {"label_names": list(self.label_names)} if self.label_names else {}
        if self.build.attnft_name:
            # timm writes the architecture from pretrained_cfg; attnft's tag means nothing under timm's name
            model_config["pretrained_cfg"] = {"architecture": self.build.name, "tag": None}
        save_file(state, str(folder / EXPORT_WEIGHTS), metadata={"format": "pt"})
        save_config_for_hf(self.model, str(folder / EXPORT_CONFIG), model_config=model_config,
                           model_args=self.build.model_args, data_config=data_args or None)

    def card_code(self) -> str:
        return (self.load_source("path/to/this/folder")
                + "transform = timm.data.create_transform(**timm.data.resolve_model_data_config(model))\n")

    def card_made_of(self) -> str:
        if self.build.attnft_name:
            return f"`{self.build.attnft_name}` (attnft's, built as timm's `{self.build.name}` with its own arguments)"
        return f"`{self.build.name}`"

    def card_about(self) -> str:
        args = ", ".join(f"`{k}={v}`" for k, v in self.build.model_args.items())
        return f"""`config.json` names the architecture, `{self.build.name}`, with every argument that builds this model
({args}) and its preprocessing (`pretrained_cfg`). Pushed to a hub repository, it loads the same
way with `timm.create_model("hf-hub:ORG/REPO", pretrained=True)`.
"""


class TimmLibrary(ModelLibrary):
    """timm: registry names (with a pretrained tag), ``hf-hub:`` and ``local-dir:`` names."""

    name = "timm"

    def claims_name(self, name: str) -> bool:
        return True  # the fallback: timm's errors say what is wrong with a name

    def claims_model(self, model: nn.Module) -> bool:
        return True

    def build(self, name, options) -> nn.Module:
        return create_timm_model(name, **options)

    def patch_grid(self, model: nn.Module) -> Optional[tuple[int, int]]:
        grid = getattr(getattr(model, "patch_embed", None), "grid_size", None)
        return tuple(int(g) for g in grid) if grid is not None else None

    def attnft_create(self, base, var: str, classes: bool) -> str:
        sizes = f", num_classes={base.num_classes}, img_size={base.input_size}" if classes else ""
        return f'import timm\n\n{var} = timm.create_model("{base.model_name}", pretrained=True{sizes})'

    def plain_adapter_use(self, base) -> str:
        return _with_build(base, lambda build: f"""The adapter holds only what training changed: create the base it was trained on, then copy each
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
""")

    def plain_peft_use(self, base) -> str:
        return _with_build(base, lambda build: f"""```python
import json

import timm
from peft import PeftModel

folder = "path/to/this/folder"
base = {build.create_call()}
model = PeftModel.from_pretrained(base, folder).eval()
transform = timm.data.create_transform(**timm.data.resolve_data_config(json.load(open(f"{{folder}}/attnft.json"))["data_config"]))
```
""")

    def plan_export(self, model, folder, data_config, label_names) -> ExportResult:
        return ExportResult(folder=folder, build=describe_model(model), model=model, data_config=dict(data_config),
                            label_names=label_names)


def _with_build(base, section: Callable[[TimmBuild], str]) -> str:
    """``section`` of how plain timm builds ``base``, with the note on its weights; else why plain timm cannot."""
    try:
        build = base_build(base.model_name, base.model_args, base.num_classes, base.input_size)
    except AdapterError as e:
        return f"Plain timm cannot create this base: {e}.\n"
    return section(build) + build.weights_note()


TIMM = TimmLibrary()

__all__ = ["TIMM", "TimmLibrary", "ExportResult", "DATA_KEYS"]
