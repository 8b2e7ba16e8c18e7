"""timm's models as attnft builds them: the model a user names, at the resolution they ask for, with its weights.

Names are whatever timm takes: a registry name with an optional pretrained tag
(``vit_small_patch16_224.augreg_in1k``), ``hf-hub:org/repo`` or ``local-dir:/path`` (a folder
with timm's ``config.json`` and ``model.safetensors``). Weights come from timm (the hub, or
the local Hugging Face cache when offline) or from a checkpoint file. transformers' image
classifiers (``transformers:ORG/REPO``, or a folder ``save_pretrained`` wrote) are built by
:mod:`attnft.models.hf_models`, with the same arguments and errors; :mod:`attnft.models.build` tells the two apart.

At the weights' own resolution timm builds and loads in one call. At another resolution the
model is built at the new size and the weights' position tensors are resampled: first by
the family's timm checkpoint filter, then by :mod:`attnft.models.resolution` for what the filter
leaves (CaiT, Hiera). Loading is strict: every key must fit, except a classifier replaced
for another number of classes.
"""
from __future__ import annotations

import difflib
import functools
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import timm
import torch
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from timm.data import resolve_model_data_config
from timm.models import get_model_input_config, model_entrypoint, parse_model_name
from torch import nn

from ..bundled import BACKGROUND, BUNDLED_MODELS
from ..core.errors import AdapterError, ConfigError, UnknownModelError
from ..core.parsing import parse_background
from ..core.hub import hub_errors
from .state_dicts import CHECKPOINT_SUFFIXES, _few, read_state_dict
from .resolution import check_img_size, check_img_size_value, check_token_count, resample_state_dict
from ..roles import is_method_tensor

__all__ = ["create_timm_model", "read_state_dict", "data_config", "model_img_size", "base_label_names", "head_fits",
           "checkpoint_bytes"]

# extra arguments timm's own builder passes to a family's checkpoint filter
FILTER_ARGS = {"timm.models.deit": {"adapt_layer_scale": True}}  # DeiT III's gamma_1 -> ls1.gamma


def create_timm_model(name: str, *, pretrained: bool, checkpoint: str | Path | None, num_classes: int | None,
                      img_size: int | None, drop_path_rate: float, **kwargs: Any) -> nn.Module:
    """timm's model ``name`` as :func:`attnft.models.create_model` builds it (its arguments)."""
    _check_name(name)
    if img_size is not None:
        check_img_size_value(img_size)  # before any hub access
    build_args = dict(kwargs, num_classes=num_classes, drop_path_rate=drop_path_rate)
    with hub_errors(name, hint="; pass a timm model name with --checkpoint FILE, or local-dir:PATH, instead",
                    missing=UnknownModelError):
        native = _skeleton(name, **build_args)
        size_args = {}
        if img_size is not None and get_model_input_config(native)["fixed_input_size"]:
            size_args = {"img_size": img_size}  # other models take any size; only the data config changes
        if img_size is not None:
            check_token_count(native, img_size, name)  # before a model sized for it is built, even on meta
        target = _skeleton(name, **size_args, **build_args) if size_args else native
        if img_size is not None:
            check_img_size(target, img_size, name)

        if checkpoint is not None:
            weights, source = read_state_dict(checkpoint), f"checkpoint {checkpoint}"
        elif pretrained and model_img_size(target) != model_img_size(native):
            _check_has_weights(native, name)
            # timm loads the weights at their own size; the model at the new size takes them resampled
            weights, source = timm.create_model(name, pretrained=True, **build_args).state_dict(), f"pretrained {name}"
        else:
            if pretrained:
                _check_has_weights(native, name)
            return timm.create_model(name, pretrained=pretrained, **size_args, **build_args)

        model = timm.create_model(name, pretrained=False, **size_args, **build_args)
        _load_weights(model, weights, source, num_classes, same_size=img_size is None)
        return model


def data_config(model: nn.Module, img_size: int | None = None, crop_pct: float | None = None,
                background: str | None = None) -> dict:
    """timm's data config (input_size, interpolation, mean, std, crop_pct, crop_mode) for the model
    as built, not as pretrained: ``input_size`` follows ``img_size`` (default: the model's size);
    and ``background``, the RGB colour a transparent pixel becomes (``--background``; default
    :func:`base_background`)."""
    channels = get_model_input_config(model)["input_size"][0]
    size = (img_size, img_size) if img_size is not None else model_img_size(model)
    config = resolve_model_data_config(model, args={"input_size": (channels, *size), "crop_pct": crop_pct})
    colour = parse_background(background) if background is not None else base_background(model)
    config["background"] = _mean_colour(config["mean"]) if colour == "mean" else tuple(colour)
    return config


def base_background(model: nn.Module):
    """The colour a transparent pixel becomes for this base: what its pretraining images show where
    nothing is, where known (the bundled models: black); else ``"mean"``, its normalisation mean,
    which the model sees as an all-zero input."""
    architecture = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    return BACKGROUND if architecture in BUNDLED_MODELS else "mean"


def _mean_colour(mean) -> tuple[int, int, int]:
    values = [round(255 * float(m)) for m in mean]
    return tuple((values * 3)[:3]) if len(values) == 1 else tuple(values[:3])


def base_label_names(model: nn.Module) -> Optional[list[list[str]]]:
    """What the model's classifier outputs are called, or None where unknown: per class, the
    names a dataset may use for it (ImageNet: the synset and the description, timm's ImageNetInfo)."""
    names = getattr(model, "pretrained_cfg", {}).get("label_names")
    if names and len(names) == model.num_classes:
        return [[str(name)] for name in names]
    subset = timm.data.infer_imagenet_subset(model)
    if subset is None:
        return None
    info = timm.data.ImageNetInfo(subset)
    return [[synset, description, description.split(",")[0]]
            for synset, description in zip(info.label_names(), info.label_descriptions())]


def head_fits(base_names: Optional[list[list[str]]], num_classes: int, task_names: list[str]) -> Optional[bool]:
    """Whether a base head of ``num_classes`` outputs predicts the task's classes, in order:
    False when the counts or the names differ, None when the base's names are unknown."""
    if num_classes != len(task_names):
        return False
    if base_names is None:
        return None

    def norm(text: str) -> str:  # 'T-shirt/top' is the folder 'T-shirt_top' or 't shirt top'
        return " ".join(re.sub(r"[^0-9a-z]+", " ", str(text).lower()).split())

    return all(norm(task) in {norm(n) for n in forms} for task, forms in zip(task_names, base_names))


def checkpoint_bytes(model: nn.Module) -> int:
    """Bytes of the model's own weights as a plain timm checkpoint holds them: every tensor of its
    state dict once (tied ones once), in their dtype. A model an adaptation method changed counts as its base without
    the method's tensors (LoRA / IA3 weights, peft's copies of modules it trains, prompts): the "full
    checkpoint" every report compares an adapter with is the same for every policy."""
    peft_model = getattr(model, "get_base_model", None)
    base = peft_model() if callable(peft_model) else model
    seen, total = set(), 0
    for key, tensor in base.state_dict().items():
        if is_method_tensor(key):
            continue
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.numel())
        if ident not in seen:
            seen.add(ident)
            total += tensor.numel() * tensor.element_size()
    return total


def model_img_size(model: nn.Module) -> tuple[int, int]:
    """The (H, W) input size in pixels the model is built for now, after any ``set_input_size``.

    timm's answer (transformers models carry the same config); for a module without one, its
    patch embedding's size, else its pretrained config's, else 224.
    """
    try:
        return tuple(int(s) for s in get_model_input_config(model)["input_size"][1:])
    except (AttributeError, KeyError):
        img_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
        if img_size is not None:
            return tuple(int(s) for s in img_size) if isinstance(img_size, (tuple, list)) else (int(img_size),) * 2
        return tuple(int(s) for s in getattr(model, "pretrained_cfg", {}).get("input_size", (3, 224, 224))[1:])


# --- names, hub and sources -------------------------------------------------------------


def _check_name(name: str) -> None:
    """Raise UnknownModelError for a name timm cannot resolve, with close names."""
    try:
        source, model_id = parse_model_name(name)
    except ValueError as e:
        raise UnknownModelError(str(e)) from e
    if source == "local-dir":
        config_file = Path(model_id) / "config.json"
        if not config_file.is_file():
            raise UnknownModelError(f"{name}: no folder with a timm config.json at {model_id}")
        try:
            arch = json.loads(config_file.read_text()).get("architecture")
        except (ValueError, AttributeError) as e:
            raise UnknownModelError(f"{name}: {config_file} is not a timm config ({e})") from e
        if not timm.is_model(arch or ""):
            raise UnknownModelError(f"{name}: {config_file} names no timm architecture (architecture={arch!r})")
        return
    if source == "hf-hub":
        repo_id = model_id.split("@", 1)[0].split(":", 1)[0]  # ORG/REPO[@REVISION]
        try:
            validate_repo_id(repo_id)
        except HFValidationError:
            raise UnknownModelError(f"{name}: {repo_id!r} is not a hub repo id; use hf-hub:ORG/REPO, "
                                    "e.g. hf-hub:timm/vit_small_patch16_224.augreg_in21k") from None
        return
    if source is not None:
        return  # other sources are checked by timm
    arch, tag = timm.models.split_model_name_tag(model_id)
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models(), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()"
        raise UnknownModelError(f"unknown model {name!r}{hint}")
    if tag and f"{arch}.{tag}" not in timm.models.get_arch_pretrained_cfgs(arch):
        tags = sorted(timm.models.get_arch_pretrained_cfgs(arch))
        raise UnknownModelError(f"unknown pretrained tag {tag!r} for {arch}; known: {', '.join(tags)}")


def _skeleton(name: str, **build_args: Any) -> nn.Module:
    """The model on the meta device: its shapes and config, without memory or init time."""
    try:
        with torch.device("meta"):
            return timm.create_model(name, pretrained=False, **build_args)
    except TypeError as e:  # a keyword the family does not take
        raise ConfigError(f"{name} does not take these model arguments: {e}") from e


def _check_has_weights(model: nn.Module, name: str) -> None:
    cfg = model.pretrained_cfg
    if cfg.get("source") in ("hf-hub", "local-dir"):
        if cfg.get("source") == "local-dir":
            _check_local_dir_weights(Path(cfg["file"]), name)
        return
    if not any(cfg.get(k) for k in ("hf_hub_id", "url", "file", "state_dict")):
        raise ConfigError(f"{name} has no pretrained weights in timm; pass a checkpoint or pretrained=False")
    if cfg.get("file") and not cfg.get("state_dict") and not Path(cfg["file"]).is_file():
        raise AdapterError(f"{name}: its pretrained weights file {cfg['file']} does not exist")


def _check_local_dir_weights(folder: Path, name: str) -> None:
    """A local-dir model is read from safetensors only: timm would unpickle a pytorch_model.bin."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES)
    if any(p.suffix == ".safetensors" for p in files):
        return
    if not files:
        raise AdapterError(f"{name}: no model.safetensors in {folder}")
    pickled = files[0]
    raise AdapterError(
        f"{name}: {folder} holds only the pickled {pickled.name}, and attnft never unpickles a model folder; "
        f"convert it once: python -c \"import torch, safetensors.torch as s; s.save_file(torch.load("
        f"'{pickled}', weights_only=True), '{folder / 'model.safetensors'}')\""
    )


# --- loading ------------------------------------------------------------------------------


def _load_weights(
    model: nn.Module,
    weights: dict[str, torch.Tensor],
    source: str,
    num_classes: int | None,
    same_size: bool,
) -> None:
    """Load ``weights`` strictly into ``model`` (built at its final size), resampling positions.

    ``same_size``: no resolution was asked for, so weights sized for another one are refused
    rather than silently resampled to the default size.
    """
    if same_size:
        _refuse_other_resolution(weights, model, source)
    weights = _timm_filter(model, source)(dict(weights), model)
    weights = resample_state_dict(weights, model)
    allowed_missing = _fit_classifier(weights, model, num_classes)
    _check_fits(weights, model, source, allowed_missing)
    model.load_state_dict(weights, strict=False)


def _timm_filter(model: nn.Module, source: str) -> Callable[[dict, nn.Module], dict]:
    """The family's timm checkpoint filter (format conversion, timm's own resampling)."""
    module_name = model_entrypoint(model.pretrained_cfg["architecture"]).__module__
    filter_fn = getattr(sys.modules[module_name], "checkpoint_filter_fn", None)
    if filter_fn is None:
        return lambda weights, model: weights
    filter_fn = functools.partial(filter_fn, **FILTER_ARGS.get(module_name, {}))

    def run(weights: dict, model: nn.Module) -> dict:
        try:
            return filter_fn(weights, model)
        except (KeyError, IndexError, AttributeError, TypeError, ValueError, RuntimeError, AssertionError) as e:
            raise AdapterError(f"{source} is not a checkpoint of {_arch(model)} ({type(e).__name__}: {e})") from e

    return run


def _refuse_other_resolution(weights: Mapping[str, torch.Tensor], model: nn.Module, source: str) -> None:
    resampled = resample_state_dict(weights, model)
    changed = [k for k in resampled if resampled[k] is not weights[k]]
    if changed:
        key = changed[0]
        raise ConfigError(
            f"{source} was made at another resolution than {_arch(model)}'s {model_img_size(model)[0]} px "
            f"({key} {tuple(weights[key].shape)}, the model needs {tuple(model.state_dict()[key].shape)}); "
            "pass img_size (--res) to build the model at the size you want"
        )


def _fit_classifier(weights: dict[str, torch.Tensor], model: nn.Module, num_classes: int | None) -> set[str]:
    """Match the classifier to the weights (num_classes None) or drop theirs for a new one.

    Returns the classifier keys the weights may lack.
    """
    names = model.pretrained_cfg.get("classifier") or ()
    names = (names,) if isinstance(names, str) else tuple(names)
    keys = {f"{n}.{p}" for n in names for p in ("weight", "bias")}
    head = weights.get(f"{names[0]}.weight") if names else None
    if num_classes is None:
        classes = head.shape[0] if head is not None else 0
        if classes != getattr(model, "num_classes", classes):
            model.reset_classifier(classes)
        return set()
    if head is not None and head.shape[0] != num_classes:
        for key in keys:
            weights.pop(key, None)
    return keys


def _check_fits(weights: Mapping[str, torch.Tensor], model: nn.Module, source: str, allowed_missing: set[str]) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in weights and k not in allowed_missing]
    unexpected = [k for k in weights if k not in expected]
    mismatched = [
        f"{k} {tuple(v.shape)} vs {tuple(expected[k].shape)}"
        for k, v in weights.items()
        if k in expected and v.shape != expected[k].shape
    ]
    problems = [
        f"{label}: {_few(keys)}"
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched))
        if keys
    ]
    if problems:
        raise AdapterError(f"{source} does not fit {_arch(model)}: " + "; ".join(problems))


def _arch(model: nn.Module) -> str:
    return model.pretrained_cfg.get("architecture") or type(model).__name__


