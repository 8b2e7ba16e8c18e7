"""Train and eval transforms, and mixup / cutmix, through timm.

``data_config`` is timm's dict (``input_size``, ``interpolation``, ``mean``, ``std``,
``crop_pct``, optionally ``crop_mode``) already at the target resolution: timm's
config does not follow a ``--res`` change by itself, the caller sets ``input_size``.
attnft adds ``background``: the colour (0-255 RGB) a transparent pixel becomes, before
anything else (:func:`attnft.models.data_config` gives the base's; white where a config has none).
"""
import re
from collections.abc import Callable, Iterator

import torch
from timm.data import DEFAULT_CROP_PCT
from timm.data import Mixup as TimmMixup
from timm.data import auto_augment, create_transform
from timm.data.mixup import mixup_target
from timm.data.transforms import MaybeToTensor
from torch.utils.data import Dataset, IterableDataset

from ..core.augmentation import AugConfig
from ..core.errors import ConfigError
from .eval_resize import ResizeCenterCrop
from .images import WHITE, ImageClassificationDataset, ImageClassificationIterable, flatten

class Flatten:
    """An RGB or RGBA PIL image -> RGB, transparent pixels on ``background``: the first step of every transform."""

    def __init__(self, background=WHITE):
        self.background = tuple(int(c) for c in background)

    def __call__(self, image):
        return flatten(image, self.background)

    def __repr__(self) -> str:
        return f"Flatten(background={self.background})"


def _posterize(img, bits_to_keep, **kwargs):
    """timm's posterize, also for 0 bits: RandAugment's ``inc1`` levels reach 0, which
    Pillow 13 refuses; older Pillow returned a black image, and so do we."""
    if bits_to_keep <= 0:
        from PIL import Image

        return Image.new(img.mode, img.size)
    return _timm_posterize(img, bits_to_keep, **kwargs)


def _patch_timm_posterize() -> None:
    global _timm_posterize
    if auto_augment.NAME_TO_OP["PosterizeIncreasing"] is not _posterize:
        _timm_posterize = auto_augment.posterize
        for name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
            auto_augment.NAME_TO_OP[name] = _posterize


_patch_timm_posterize()


# (policy, section) -> the largest value: magnitudes beyond 10 are clipped by timm without a word, op
# counts beyond a few make each step crawl (rand-m9-n100000 never finished one)
_MAGNITUDE = (10, "timm's magnitudes end at 10: more is clipped")
_OPS = (16, "ops per image: more and a step crawls")
_AUG_BOUNDS = {("rand", "m"): _MAGNITUDE, ("rand", "mmax"): _MAGNITUDE, ("rand", "n"): _OPS,
               ("augmix", "m"): _MAGNITUDE, ("augmix", "w"): _OPS, ("augmix", "d"): _OPS}


def _within(number: str, bound: float) -> bool:
    try:
        return 0 <= float(number) <= bound
    except ValueError:
        return False


def check_auto_augment(policy: str | None) -> None:
    """ConfigError unless timm reads all of the auto-augment ``policy`` (``rand-m9-mstd0.5``, ``augmix-m5``,
    ``v0``, ...). timm's parsers skip a section without a number, so ``rand-zzz`` would silently be
    plain RandAugment: every section after the name must be KEY+NUMBER (or RandAugment's ``tNAMES``)."""
    if not policy:
        return
    name, *sections = policy.split("-")
    for section in sections:
        if not re.search(r"\d", section) and not (name == "rand" and section.startswith("t") and len(section) > 1):
            raise ConfigError(f"cannot read auto_augment {policy!r}: section {section!r} is not KEY+NUMBER "
                              "(e.g. rand-m9-mstd0.5-inc1, augmix-m5-w4, v0)")
    for section in sections:
        key, number = re.match(r"([a-z]*)(.*)", section).groups()
        bound, why = _AUG_BOUNDS.get((name, key), (None, ""))
        if bound is not None and not _within(number, bound):
            raise ConfigError(f"auto_augment {policy[:60]!r}: {key} must be from 0 to {bound} ({why})")
    hparams = dict(translate_const=100, img_mean=(124, 116, 104))
    try:
        if name == "rand":
            auto_augment.rand_augment_transform(policy, hparams)
        elif name == "augmix":
            auto_augment.augment_and_mix_transform(policy, hparams)
        else:
            auto_augment.auto_augment_transform(policy, hparams)
    except (AssertionError, ValueError, KeyError, TypeError) as error:
        reason = str(error).strip() or type(error).__name__
        raise ConfigError(f"cannot read auto_augment {policy!r} ({reason}): use a timm policy such as "
                          "rand-m9-mstd0.5-inc1 (RandAugment), augmix-m5, or v0 / original (AutoAugment)") from None


def build_transforms(data_config: dict, *, train: bool, aug: AugConfig | None = None) -> Callable:
    """PIL RGB or RGBA image -> float tensor [3, H, W] normalised, with (H, W) = ``data_config["input_size"][1:]``:
    transparency flattened onto ``data_config["background"]``, then timm's transform (for eval, its resize and
    centre crop as :class:`~attnft.data.eval_resize.ResizeCenterCrop` computes them, at a cost bounded by the
    image and the output whatever its shape; training crops before it resizes, so its cost is bounded already)."""
    from torchvision.transforms import Compose

    return Compose([Flatten(data_config.get("background") or WHITE), _timm_transform(data_config, train, aug)])


def _timm_transform(data_config: dict, train: bool, aug: AugConfig | None) -> Callable:
    interpolation = data_config.get("interpolation", "bicubic")
    common = dict(input_size=data_config["input_size"], mean=data_config["mean"], std=data_config["std"])
    if not train:
        return _eval_transform(data_config, interpolation, common)
    aug = aug or AugConfig()
    return create_transform(
        **common,
        is_training=True,
        scale=aug.scale,
        ratio=aug.ratio,
        hflip=aug.hflip,
        vflip=aug.vflip,
        color_jitter=aug.color_jitter or None,
        auto_augment=aug.auto_augment,
        interpolation=aug.train_interpolation or interpolation,
        re_prob=aug.reprob,
        re_mode=aug.remode,
        re_count=aug.recount,
    )


def _eval_transform(data_config: dict, interpolation: str, common: dict) -> Callable:
    """timm's eval transform; its centre mode's resize and crop (which would resize a 100000x1 image to
    22,400,000x224 before cropping) done by :class:`ResizeCenterCrop`. squash and border resize to the output's
    size (bounded already), and a crop_pct over 1 pads: those stay timm's."""
    from torchvision.transforms import Compose, Normalize

    crop_pct = data_config.get("crop_pct") or DEFAULT_CROP_PCT
    if data_config.get("crop_mode") not in (None, "center") or crop_pct > 1:
        return create_transform(**common, is_training=False, interpolation=interpolation, crop_pct=crop_pct,
                                crop_mode=data_config.get("crop_mode"))
    return Compose([ResizeCenterCrop(common["input_size"][-2:], crop_pct, interpolation), MaybeToTensor(),
                    Normalize(mean=torch.tensor(common["mean"]), std=torch.tensor(common["std"]))])


class TransformedDataset(Dataset):
    """A map-style split with ``transform`` applied to its images: ``(tensor, int)``, ``None`` kept for unreadable."""

    def __init__(self, split: ImageClassificationDataset, transform: Callable):
        self.split = split
        self.transform = transform

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int):
        sample = self.split[index]
        if sample is None:
            return None
        image, label = sample
        return self.transform(image), label


class TransformedIterable(IterableDataset):
    """A streamed split with ``transform`` applied to its images."""

    def __init__(self, split: ImageClassificationIterable, transform: Callable):
        self.split = split
        self.transform = transform

    def set_epoch(self, epoch: int) -> None:
        self.split.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        for image, label in self.split:
            yield self.transform(image), label


def with_transform(split, transform: Callable) -> TransformedDataset | TransformedIterable:
    """``split`` (a :class:`~attnft.data.loading.TaskData` split) with ``transform`` applied to its images."""
    if isinstance(split, IterableDataset):
        return TransformedIterable(split, transform)
    return TransformedDataset(split, transform)


class Mixup(TimmMixup):
    """timm's Mixup that also takes odd batches (a skipped unreadable image or a short last
    batch): the last sample is left unmixed, with a smoothed one-hot target."""

    def __call__(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if len(x) % 2 == 0:
            return super().__call__(x, target)
        if len(x) == 1:
            return x, mixup_target(target, self.num_classes, 1.0, self.label_smoothing)
        # timm mixes in place, so mixing the view x[:-1] mixes x
        _, mixed = super().__call__(x[:-1], target[:-1])
        last = mixup_target(target[-1:], self.num_classes, 1.0, self.label_smoothing)
        return x, torch.cat([mixed, last])


def make_mixup(aug: AugConfig, num_classes: int) -> Mixup | None:
    """A mixup/cutmix function ``(images [B,3,H,W], labels [B]) -> (images, soft targets [B, num_classes])``,
    or None when ``aug`` turns both off (then train with plain labels and ``aug.smoothing``)."""
    if aug.mixup <= 0 and aug.cutmix <= 0:
        return None
    return Mixup(mixup_alpha=aug.mixup, cutmix_alpha=aug.cutmix, prob=aug.mixup_prob,
                 switch_prob=aug.mixup_switch_prob, mode=aug.mixup_mode,
                 label_smoothing=aug.smoothing, num_classes=num_classes)
