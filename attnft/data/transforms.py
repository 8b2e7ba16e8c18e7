"""Train and eval transforms, and mixup / cutmix, through timm.

``data_config`` is timm's dict (``input_size``, ``interpolation``, ``mean``, ``std``,
``crop_pct``, optionally ``crop_mode``) already at the target resolution: timm's
config does not follow a ``--res`` change by itself, the caller sets ``input_size``.
attnft adds ``background``: the colour (0-255 RGB) a transparent pixel becomes, before
anything else (:func:`attnft.models.data_config` gives the base's; white where a config has none).
"""
import logging
import math
import re
from collections.abc import Callable, Iterator

import torch
from PIL import Image
from timm.data import Mixup as TimmMixup
from timm.data import auto_augment, create_transform
from timm.data.mixup import mixup_target
from torch.utils.data import Dataset, IterableDataset

from ..core.augmentation import AugConfig
from ..core.errors import ConfigError
from .images import WHITE, ImageClassificationDataset, ImageClassificationIterable, flatten

logger = logging.getLogger(__name__)


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


class ResizeLimit:
    """Refuses an image that timm's eval resize would blow up past ``max_pixels`` (PIL's ``MAX_IMAGE_PIXELS``).

    The eval transform resizes the shorter side to ``input_size / crop_pct`` and the longer in proportion: a
    20000x1 PNG of 102 bytes would become 4,480,000x224 pixels (3.6 GB of floats). Raises
    ``Image.DecompressionBombError`` (a data split skips the image with a warning, the server answers 413)."""

    def __init__(self, data_config: dict, max_pixels: int | None = None):
        size = data_config["input_size"][-2:]
        crop_pct = data_config.get("crop_pct") or 1.0
        self.scale = [math.floor(side / crop_pct) for side in size]
        self.keeps_ratio = data_config.get("crop_mode", "center") not in ("squash", "border")
        self.max_pixels = max_pixels if max_pixels is not None else Image.MAX_IMAGE_PIXELS

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after the eval transform's resize."""
        if not self.keeps_ratio:
            return self.scale[1], self.scale[0]
        short = max(self.scale)
        factor = short / max(min(width, height), 1)
        return max(short, math.ceil(width * factor)), max(short, math.ceil(height * factor))

    def __call__(self, image):
        width, height = self.resized(*image.size)
        if width * height > self.max_pixels:
            raise Image.DecompressionBombError(
                f"image of {image.width}x{image.height} pixels would be resized to {width}x{height} "
                f"({width * height:,} pixels), over the limit of {self.max_pixels:,} pixels")
        return image

    def __repr__(self) -> str:
        return f"ResizeLimit(max_pixels={self.max_pixels})"


def build_transforms(data_config: dict, *, train: bool, aug: AugConfig | None = None,
                     max_pixels: int | None = None) -> Callable:
    """PIL RGB or RGBA image -> float tensor [3, H, W] normalised, with (H, W) = ``data_config["input_size"][1:]``:
    transparency flattened onto ``data_config["background"]``, then timm's transform (for eval, after
    :class:`ResizeLimit`: training crops before it resizes, so its output is bounded already)."""
    from torchvision.transforms import Compose

    steps = [] if train else [ResizeLimit(data_config, max_pixels)]
    return Compose(steps + [Flatten(data_config.get("background") or WHITE), _timm_transform(data_config, train, aug)])


def _timm_transform(data_config: dict, train: bool, aug: AugConfig | None) -> Callable:
    interpolation = data_config.get("interpolation", "bicubic")
    common = dict(input_size=data_config["input_size"], mean=data_config["mean"], std=data_config["std"])
    if not train:
        return create_transform(**common, is_training=False, interpolation=interpolation,
                                crop_pct=data_config.get("crop_pct"), crop_mode=data_config.get("crop_mode"))
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
        try:
            return self.transform(image), label
        except Image.DecompressionBombError as error:  # an image its resize would blow up: skipped, as unreadable
            logger.warning("skipping sample %d of %s: %s", index, self.split.source, error)
            return None


class TransformedIterable(IterableDataset):
    """A streamed split with ``transform`` applied to its images."""

    def __init__(self, split: ImageClassificationIterable, transform: Callable):
        self.split = split
        self.transform = transform

    def set_epoch(self, epoch: int) -> None:
        self.split.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        for image, label in self.split:
            try:
                yield self.transform(image), label
            except Image.DecompressionBombError as error:
                logger.warning("skipping an image of %s: %s", self.split.source, error)


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
