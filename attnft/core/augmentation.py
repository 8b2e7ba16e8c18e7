"""How strongly a run augments: named levels, and the rule ``--aug auto`` follows.

Pure data and functions (no torch), so the config and the CLI can use them.

Why a rule rather than one default: augmentation trades fitting speed for generalisation. A
short fine-tuning run sees each image a few times and has no time to overfit, so every crop it
takes away from the image is accuracy lost; a long run on a small dataset memorises it without
augmentation, which is why DeiT's transfer recipes run 1000 epochs with RandAugment, mixup and
cutmix. ``auto`` picks the level from how many times the run will see each training image.

Measured (attn policy, the bundled ViT, ``benchmarks/results/aug_levels.md``): at 5 and 20
epochs no augmentation beat every level on scikit-learn's digits and on MNIST (20 epochs, MNIST:
none 82.7%, light 79.1%, light with flips 75.1%, medium 59.6%); at 50 epochs on digits light
crops won (97.5% against 96.0% none, 94.4% medium, 83.3% heavy). Hence none below 30 epochs and
light from there. Flips are not label-preserving for every task (digits, text: 4 points lost at
20 epochs), so no level below DeiT's ``heavy`` flips; pass ``--hflip 0.5`` for natural images.
The medium and heavy thresholds (100, 300 epochs) were not measured here; they follow DeiT's
practice of its full recipe for runs of hundreds of epochs.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

AUG_LEVELS = ("none", "light", "medium", "heavy")
AUG_CHOICES = ("auto",) + AUG_LEVELS

# auto: the level for runs of fewer than this many passes over the training images
AUTO_EPOCH_THRESHOLDS = ((30, "none"), (100, "light"), (300, "medium"))  # beyond: heavy


@dataclass(frozen=True)
class AugConfig:
    """Training augmentation, in timm's terms (``timm.data.create_transform`` and ``Mixup``)."""

    auto_augment: str | None = None  # timm string, e.g. "rand-m9-mstd0.5-inc1" (RandAugment)
    reprob: float = 0.0  # random erasing probability
    remode: str = "pixel"  # random erasing fill: "const", "rand" or "pixel"
    recount: int = 1
    color_jitter: float = 0.0  # brightness/contrast/saturation factor; timm ignores it under RandAugment
    hflip: float = 0.0
    vflip: float = 0.0
    scale: tuple[float, float] = (1.0, 1.0)  # random-resized-crop area range
    ratio: tuple[float, float] = (1.0, 1.0)  # random-resized-crop aspect range
    train_interpolation: str | None = None  # None: the data config's; "random" mixes bilinear and bicubic
    mixup: float = 0.0  # mixup alpha; 0 turns it off
    cutmix: float = 0.0  # cutmix alpha; 0 turns it off
    mixup_prob: float = 1.0  # probability of mixing a batch at all
    mixup_switch_prob: float = 0.5  # probability of cutmix instead of mixup when both are on
    mixup_mode: str = "batch"  # "batch", "pair" or "elem"
    smoothing: float = 0.1  # label smoothing (folded into the mixed targets when mixing)
    # the eval centre crop that matches what training shows: a run that never zooms in
    # evaluates on the whole image; None keeps the model's own crop_pct
    eval_crop_pct: float | None = 1.0


AUG_FIELDS = tuple(f.name for f in fields(AugConfig))

LEVELS: dict[str, AugConfig] = {
    # the image as it is, resized: what a hand-written fine-tuning loop does
    "none": AugConfig(),
    # small crops: a little regularisation for runs long enough to start memorising
    "light": AugConfig(scale=(0.8, 1.0), ratio=(3 / 4, 4 / 3)),
    # RandAugment at moderate strength and the wider crop range, no mixing, no flips
    "medium": AugConfig(scale=(0.25, 1.0), ratio=(3 / 4, 4 / 3), auto_augment="rand-m6-mstd0.5-inc1",
                        eval_crop_pct=None),
    # DeiT's fine-tuning recipe (README_deit.md, main.py defaults): RandAugment m9, random
    # erasing 0.25, mixup 0.8 / cutmix 1.0, bicubic, the ImageNet crop range
    "heavy": AugConfig(scale=(0.08, 1.0), auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25, color_jitter=0.3,
                       train_interpolation="bicubic", mixup=0.8, cutmix=1.0, hflip=0.5, ratio=(3 / 4, 4 / 3),
                       eval_crop_pct=None),
}


def auto_aug_level(epochs: float) -> str:
    """The level ``--aug auto`` picks for a run of ``epochs`` passes over its training images
    (fractions allowed: a ``--steps`` run counts steps x global batch / images)."""
    for below, level in AUTO_EPOCH_THRESHOLDS:
        if epochs < below:
            return level
    return "heavy"


def resolve_aug(level: str, overrides: dict | None = None) -> AugConfig:
    """``LEVELS[level]`` with every field in ``overrides`` that is not None put over it."""
    if level not in LEVELS:
        raise ValueError(f"unknown augmentation level {level!r}; choose from {', '.join(AUG_LEVELS)}")
    given = {k: v for k, v in (overrides or {}).items() if k in AUG_FIELDS and v is not None}
    return replace(LEVELS[level], **given)


def describe_aug(aug: AugConfig) -> str:
    """A short human summary: 'crop 80-100%, hflip 0.5, RandAugment rand-m9..., mixup 0.8'."""
    parts = []
    if aug.scale != (1.0, 1.0) or aug.ratio != (1.0, 1.0):
        parts.append(f"crop {aug.scale[0]:.0%}-{aug.scale[1]:.0%}")
    if aug.hflip:
        parts.append(f"hflip {aug.hflip:g}")
    if aug.vflip:
        parts.append(f"vflip {aug.vflip:g}")
    if aug.auto_augment:
        parts.append(aug.auto_augment)
    elif aug.color_jitter:
        parts.append(f"colour jitter {aug.color_jitter:g}")
    if aug.reprob:
        parts.append(f"erasing {aug.reprob:g}")
    if aug.mixup or aug.cutmix:
        parts.append(f"mixup {aug.mixup:g} / cutmix {aug.cutmix:g}")
    return ", ".join(parts) or "resize only"
