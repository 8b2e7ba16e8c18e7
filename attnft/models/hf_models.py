"""transformers' image classifiers as attnft models: ``transformers:ORG/REPO`` or a ``save_pretrained`` folder.

Names: ``transformers:google/vit-base-patch16-224`` (the hub, or the local Hugging Face cache
offline), ``transformers:/path/to/folder`` or the bare folder path (a folder ``save_pretrained``
wrote: a ``config.json`` with a ``model_type``). The class is the checkpoint's own
(``architectures`` in its config) when it is an image classifier, else
``AutoModelForImageClassification``'s.

The model keeps transformers' class, module tree and parameter names, so role maps, adapters,
merged exports and plain ``PeftModel.from_pretrained`` see transformers' own model. What attnft
calls on a model (timm's interface) is added in one place, :class:`TimmInterface`, mixed in
front of the model's class under the same name: ``model(x)`` returns the logits tensor,
``num_classes``, ``reset_classifier``, ``pretrained_cfg`` (mean, std, crop and interpolation
from the checkpoint's ``preprocessor_config.json``), ``set_input_size``, and
``forward_features`` / ``forward_head`` for multi-task batches. Such a model pickles
(``torch.save(model)``, ``copy.deepcopy``) through the plain class and comes back interfaced.
CLIP's image classifier keeps its image and patch size in ``config.vision_config``
(:func:`vision_config`, :func:`patch_side`, :func:`image_side` read either).

Resolution: a model asked for at another size is rebuilt with ``config.image_size`` set to it,
and its absolute position embedding is computed once by the model's own
``interpolate_pos_encoding`` (so it computes what ``model(x, interpolate_pos_encoding=True)``
of the checkpoint computes); relative-position tables and embeddings without such a method are
resampled as for timm (:mod:`attnft.models.hf_resolution`).
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import nn

from ..core.errors import AdapterError, ConfigError, UnknownModelError, first_line
from ..core.files import PROCESSOR_FILE
from ..core.hub import hub_errors
from .hf_config import image_side, patch_side, vision_config
from .hf_heads import backbone, feature_width, head_fn
from .resolution import check_img_size_value
from ..roles import Role, build_role_map

__all__ = ["PREFIX", "create_transformers_model", "processor_data_config",
           "TimmInterface", "PROCESSOR_FILE", "vision_config", "patch_side", "image_side"]

PREFIX = "transformers:"
# PIL resampling codes (transformers' ``resample``) -> timm's interpolation names
_PIL_INTERPOLATION = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
_DEFAULT_MEAN, _DEFAULT_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)  # transformers' ViTImageProcessor defaults


# --- names --------------------------------------------------------------------------------


def _source(name: str) -> tuple[str, bool]:
    """(what transformers' from_pretrained takes, whether it is a local folder); UnknownModelError if neither."""
    source = name[len(PREFIX):] if name.startswith(PREFIX) else name
    if Path(source).expanduser().is_dir():
        folder = Path(source).expanduser()
        if not (folder / "config.json").is_file():
            raise UnknownModelError(f"{name}: {folder} has no config.json (a folder save_pretrained wrote)")
        return str(folder), True
    if source.startswith(("/", ".", "~")) or source.count("/") > 1:
        raise UnknownModelError(f"{name}: no folder {source}")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        raise UnknownModelError(f"{name}: {source!r} is neither a folder nor a hub repo id; use transformers:ORG/REPO, "
                                "e.g. transformers:google/vit-base-patch16-224") from None
    return source, False


@contextlib.contextmanager
def _load_errors(name: str) -> Iterator[None]:
    """transformers' loading failures as one-line user errors: the hub's (which it wraps in OSError)
    as for timm models, the rest (an unknown model_type, a config it cannot read) as UnknownModelError."""
    try:
        with hub_errors(name, hint="; pass transformers:PATH, a folder save_pretrained wrote, instead",
                        missing=UnknownModelError):
            yield
    except (OSError, ValueError, KeyError) as e:
        raise UnknownModelError(f"{name}: transformers cannot load it ({first_line(e)})") from e


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers draws a bar per checkpoint it loads; attnft's output has its own."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


# --- building -----------------------------------------------------------------------------


def create_transformers_model(name: str, *, pretrained: bool, checkpoint: str | Path | None, num_classes: int | None,
                              img_size: int | None, drop_path_rate: float, **kwargs: Any) -> nn.Module:
    """The transformers image classifier ``name`` at ``img_size`` px (None: its config's size), as
    :func:`attnft.models.create_model` builds timm models. ``kwargs`` override config fields.

    ``checkpoint``: a state dict file with transformers' own keys. ``num_classes`` None takes its
    classifier's class count (as for timm), another number drops its classifier for a new one. Its
    position tensors may be at the config's size or, with ``img_size``, already at that size.

    Raises UnknownModelError, ConfigError, AdapterError or OfflineError with a one-line reason.
    """
    import transformers

    source, local = _source(name)
    if img_size is not None:
        check_img_size_value(img_size)
    with _load_errors(name), no_progress_bars():
        config = transformers.AutoConfig.from_pretrained(source)
        unknown = sorted(k for k in kwargs if not hasattr(config, k))
        if unknown:
            raise ConfigError(f"{name} ({config.model_type}) has no config field {', '.join(unknown)}")
        for key, value in kwargs.items():
            setattr(config, key, value)
        if drop_path_rate:
            if not hasattr(config, "drop_path_rate"):
                raise ConfigError(f"{name} ({config.model_type}) has no drop path (stochastic depth)")
            config.drop_path_rate = drop_path_rate
        cls = _classifier_class(config)
        if pretrained and checkpoint is None:
            model = cls.from_pretrained(source, config=config)
        else:
            model = cls._from_config(config)
        model = model.float()  # as timm models are, whatever dtype the checkpoint was saved in
        processor = _read_processor(source)
    model.__class__ = _interfaced(type(model))
    model.__dict__["_attnft_source"] = {"name": name, "hub_id": None if local else source, "processor": processor}
    if checkpoint is not None:
        _load_checkpoint(model, checkpoint, num_classes, img_size)
    if img_size is not None and img_size != model.img_size:
        model.set_input_size(img_size=img_size, name=name)
    if num_classes is not None and num_classes != model.num_classes:
        model.reset_classifier(num_classes)
    return model


def _classifier_class(config) -> type:
    """The checkpoint's own class when it classifies images (DeiT's distilled one too), else the Auto mapping's."""
    import transformers

    for arch in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, arch, None)
        if cls is not None and "ForImageClassification" in arch:
            return cls
    try:
        found = transformers.AutoModelForImageClassification._model_mapping[type(config)]
        return found[0] if isinstance(found, tuple) else found  # DeiT maps to (its classifier, the distilled one)
    except KeyError:
        raise UnknownModelError(f"transformers has no image classifier for model_type {config.model_type!r}") from None


def _read_processor(source: str) -> dict:
    """The checkpoint's ``preprocessor_config.json`` as a dict ({} when it has none)."""
    from transformers.utils import cached_file

    path = cached_file(source, PROCESSOR_FILE, _raise_exceptions_for_missing_entries=False,
                       _raise_exceptions_for_connection_errors=False)
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as e:
        raise UnknownModelError(f"{path} is not valid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _load_checkpoint(model: nn.Module, checkpoint: str | Path, num_classes: Optional[int],
                     img_size: Optional[int]) -> None:
    """A state dict file with transformers' own keys, loaded strictly into the model (interfaced).

    The classifier is fitted first: ``num_classes`` None gives the model the checkpoint's classes
    (0 when it has no classifier), another number drops the checkpoint's classifier when it has
    other classes (the model's new one is made later). Position tensors of another size than the
    config's are taken as made at ``img_size`` (the model is resized before loading them).
    """
    from .state_dicts import read_state_dict

    weights = dict(read_state_dict(checkpoint))
    roles = build_role_map(model)
    classifiers = set(_classifiers(model))
    in_head = [k for k in weights if roles.head_of(k) in classifiers]
    found = next((int(weights[k].shape[0]) for k in in_head if weights[k].ndim == 2), 0)
    want = found if num_classes is None else num_classes
    if want != model.num_classes:
        model.reset_classifier(want)
    allowed_missing: set[str] = set()
    if found != want:
        for key in in_head:
            del weights[key]
        allowed_missing = {k for k in model.state_dict() if roles.head_of(k) in classifiers}
    grid = set(roles.grid_tensors()) | set(roles.names_with_role(Role.POS_EMBED))
    expected = model.state_dict()
    other_size = [k for k in grid if k in weights and k in expected and weights[k].shape != expected[k].shape]
    if other_size and img_size is not None and img_size != model.img_size:
        model.set_input_size(img_size=img_size)  # a checkpoint saved at the size asked for
        expected = model.state_dict()
    missing = [k for k in expected if k not in weights and k not in allowed_missing]
    unexpected = [k for k in weights if k not in expected]
    wrong = [k for k in weights if k in expected and weights[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        parts = [f"{label}: {', '.join(keys[:4])}" for label, keys in
                 (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)) if keys]
        hint = ""
        if any(k in grid for k in wrong):
            hint = (f" (its position tensors are for another input size than {model.img_size} px: "
                    "pass img_size, --res, of the size it was saved at)")
        raise AdapterError(f"checkpoint {checkpoint} does not fit {type(model).__name__}: " + "; ".join(parts) + hint)
    model.load_state_dict(weights, strict=False)


# --- data config --------------------------------------------------------------------------


def processor_data_config(processor: dict, image_size: int) -> dict:
    """timm's data config (mean, std, crop_pct, crop_mode, interpolation, input_size) from a
    transformers image processor's config, for a model that takes ``image_size`` px.

    ``size`` as height/width resizes without keeping the aspect ratio (timm's ``squash``);
    ``shortest_edge`` then a centre crop is timm's ``center`` with crop_pct = crop / edge.
    """
    mean = tuple(processor.get("image_mean") or _DEFAULT_MEAN)
    std = tuple(processor.get("image_std") or _DEFAULT_STD)
    if processor.get("do_normalize") is False:
        mean, std = (0.0,) * 3, (1.0,) * 3
    size = processor.get("size")
    resize_side = None
    crop_mode = "center"
    if isinstance(size, dict) and "height" in size:
        resize_side, crop_mode = size["height"], "squash"
    elif isinstance(size, dict) and "shortest_edge" in size:
        resize_side = size["shortest_edge"]
    elif isinstance(size, int):
        resize_side = size
    crop = processor.get("crop_size")
    crop_side = crop.get("height") if isinstance(crop, dict) else crop
    if processor.get("crop_pct"):
        crop_pct = float(processor["crop_pct"])
    elif processor.get("do_center_crop") and crop_side and resize_side:
        crop_pct = float(crop_side) / float(resize_side)
    else:
        crop_pct = 1.0
    return {
        "input_size": (3, image_size, image_size),
        "interpolation": _PIL_INTERPOLATION.get(processor.get("resample", 3), "bicubic"),
        "mean": mean,
        "std": std,
        "crop_pct": crop_pct,
        "crop_mode": crop_mode,
    }


# --- the interface attnft calls -----------------------------------------------------------


class TimmInterface:
    """timm's calls on a transformers image classifier; mixed in front of the model's own class."""

    def forward(self, pixel_values=None, *args, **kwargs):
        """(B, classes) logits of ``pixel_values`` (B, 3, H, W); with any other argument, transformers' own output."""
        if args or kwargs:
            return super().forward(pixel_values, *args, **kwargs)
        return super().forward(pixel_values).logits

    @property
    def num_classes(self) -> int:
        return int(self.config.num_labels)

    @property
    def img_size(self) -> int:
        return image_side(self.config)

    @property
    def pretrained_cfg(self) -> dict:
        """What timm's ``pretrained_cfg`` says, for this model as it is now (size, classes)."""
        source = self.__dict__["_attnft_source"]
        labels = [str(self.config.id2label[i]) for i in range(self.num_classes)] if self.num_classes else []
        default_labels = all(label == f"LABEL_{i}" for i, label in enumerate(labels))
        return {
            "architecture": source["name"], "tag": None, "source": "transformers", "hf_hub_id": source["hub_id"],
            "license": None, "num_classes": self.num_classes, "fixed_input_size": True, "classifier": "classifier",
            "label_names": None if default_labels else labels,
            **processor_data_config(source["processor"], self.img_size),
        }

    default_cfg = pretrained_cfg

    @property
    def image_processor(self) -> dict:
        """The checkpoint's ``preprocessor_config.json`` as a dict ({} when it has none)."""
        return self.__dict__["_attnft_source"]["processor"]

    def __reduce_ex__(self, protocol):
        """Pickle (``torch.save(model)``, ``copy.deepcopy``) through the plain class: this class has the plain
        one's module and name, which pickle would look it up by and find the plain class instead."""
        return _unpickled, (type(self)._attnft_plain_class,), self.__getstate__()

    def no_weight_decay(self) -> set[str]:
        """What a timm model lists for timm's optimizer factory: the position embeddings, relative-position tables
        and tokens (the role map's), which weight decay then spares as timm's ViT, BEiT and Swin do (transformers'
        own Trainer decays them)."""
        role_map = build_role_map(self)
        parameters = {name for name, _ in self.named_parameters()}
        spared = {name for role in (Role.POS_EMBED, Role.TOKENS) for name in role_map.names_with_role(role)}
        return (spared | set(role_map.grid_tensors())) & parameters

    def reset_classifier(self, num_classes: int) -> None:
        """A new classifier for ``num_classes`` (0: none), initialised as transformers does, on the old one's device."""
        reference = next(self.parameters())
        for path, old in _classifiers(self).items():
            width = old.in_features if isinstance(old, nn.Linear) else feature_width(self)
            new: nn.Module = nn.Identity()
            if num_classes > 0:
                new = nn.Linear(width, num_classes, device=reference.device, dtype=reference.dtype)
                nn.init.trunc_normal_(new.weight, std=getattr(self.config, "initializer_range", 0.02))
                nn.init.zeros_(new.bias)
            self.set_submodule(path, new)
        self.config.num_labels = num_classes  # id2label becomes LABEL_0, ...
        self.num_labels = num_classes  # what transformers' forward reads beside the config

    def set_input_size(self, img_size, name: Optional[str] = None) -> None:
        """Rebuild for ``img_size`` px (an int or (H, W), square), position tensors resampled; see the module doc."""
        from .hf_resolution import at_size, check_size

        size = img_size if isinstance(img_size, int) else int(img_size[0])
        if not isinstance(img_size, int) and len(set(img_size)) != 1:
            raise ConfigError(f"transformers models take square inputs, not {tuple(img_size)}")
        check_size(self, size, name or self.__dict__["_attnft_source"]["name"])
        resized = at_size(self, size)  # in this model's train / eval mode
        self._modules = resized._modules
        self.config = resized.config

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The backbone's last hidden state (B, tokens, C) of ``x`` (B, 3, H, W)."""
        head_fn(self)  # refuse a family whose head is unknown before computing anything
        return backbone(self)(x).last_hidden_state

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        """Logits (B, classes) from :meth:`forward_features`' output, as the family's classifier computes them."""
        return head_fn(self)(self, features)


_INTERFACED: dict[type, type] = {}


def _unpickled(plain: type) -> nn.Module:
    """An empty instance of ``plain`` interfaced, which unpickling fills with the pickled state."""
    cls = _interfaced(plain)
    return cls.__new__(cls)


def _interfaced(cls: type) -> type:
    """``cls`` with :class:`TimmInterface` in front, under its own name and module (what the role map and
    ``save_pretrained``'s ``architectures`` read)."""
    if issubclass(cls, TimmInterface):
        return cls
    if cls not in _INTERFACED:
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "_attnft_plain_class": cls}
        _INTERFACED[cls] = type(cls.__name__, (TimmInterface, cls), namespace)
    return _INTERFACED[cls]


def _classifiers(model: nn.Module) -> dict[str, nn.Module]:
    """The classifiers among the role map's head modules (DeiT's distilled model has two): path -> module,
    an ``nn.Linear``, or ``nn.Identity`` when built without classes."""
    out = {}
    for path in build_role_map(model).head_modules():
        module = model.get_submodule(path)
        if isinstance(module, (nn.Linear, nn.Identity)):
            out[path] = module
    return out
