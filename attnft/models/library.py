"""What differs between the libraries a base comes from (timm, transformers): one object per library.

:mod:`.build` decides the library once, from a model's name or from a built model, and hands out its
:class:`ModelLibrary`; everything downstream asks that object: how to build the model, its patch
grid, the lines a card shows to create the base (with attnft, or with the library alone), and the
folder a merged export is (what the library's own loader reads). A third library is one more
subclass here and its family tables in :mod:`attnft.roles.families`.

A card's ``base`` is anything with ``model_name``, ``model_args``, ``num_classes`` and
``input_size`` (an adapter's config, a peft adapter's sidecar).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from torch import nn


@dataclass
class PlainExport:
    """A merged model as a folder its library loads alone: where it went, and the lines that load it.

    Made by :meth:`ModelLibrary.plan_export` before anything is written (it refuses a model it cannot
    export); :meth:`write` fills a folder with everything but the card.
    """

    folder: Path
    library = ""  # what loads it alone

    def load_source(self, folder: Optional[str] = None) -> str:
        """Python source that loads the export with its library alone (``folder``: the path to show, default the real one)."""
        raise NotImplementedError

    def write(self, folder: Path) -> None:
        """The export's files (weights, config, preprocessing) in ``folder``; the card is the caller's."""
        raise NotImplementedError

    def card_code(self) -> str:
        """The card's code block: :meth:`load_source` and what else it shows."""
        return self.load_source("path/to/this/folder")

    def card_made_of(self) -> str:
        """What the card says the checkpoint is (markdown), e.g. "`ViTForImageClassification`"."""
        raise NotImplementedError

    def card_about(self) -> str:
        """The card's closing paragraph: what the folder's files are and how a hub copy loads."""
        raise NotImplementedError


class ModelLibrary:
    """How one library names, builds and exports a base, and what a card shows to create one."""

    name: str  # "timm", "transformers": a card's tag, what loads an export alone

    def claims_name(self, name: str) -> bool:
        """Whether ``name`` (as :func:`attnft.models.create_model` takes it) names a model of this library."""
        raise NotImplementedError

    def claims_model(self, model: nn.Module) -> bool:
        """Whether ``model`` was built by this library."""
        raise NotImplementedError

    def build(self, name: str, options: dict[str, Any]) -> nn.Module:
        """The model ``name`` as :func:`attnft.models.create_model` builds it with ``options`` (its keyword arguments)."""
        raise NotImplementedError

    def patch_grid(self, model: nn.Module) -> Optional[tuple[int, int]]:
        """The (H, W) token grid of the model's patch embedding, or None for models without one."""
        raise NotImplementedError

    def attnft_create(self, base, var: str, classes: bool) -> str:
        """A card's lines that create ``base`` with attnft installed, as ``var`` (with its classes if ``classes``)."""
        raise NotImplementedError

    def plain_adapter_use(self, base) -> str:
        """A card's section that loads an attnft adapter on ``base`` with this library and safetensors alone."""
        raise NotImplementedError

    def plain_peft_use(self, base) -> str:
        """A card's section that loads a peft adapter on ``base`` with this library and peft alone."""
        raise NotImplementedError

    def plan_export(self, model: nn.Module, folder: Path, data_config: dict,
                    label_names: Optional[list[str]]) -> PlainExport:
        """The merged ``model`` as an export to ``folder``; AdapterError, nothing written, when the library could not load it."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<model library {self.name}>"
