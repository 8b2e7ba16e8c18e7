"""The augmentation levels and the rule ``--aug auto`` follows (a pure function of the run's budget)."""
import dataclasses

import pytest

from attnft.core.augmentation import AUG_LEVELS, LEVELS, auto_aug_level, resolve_aug
from attnft.training.config import FinetuneConfig


@pytest.mark.parametrize("epochs, level", [
    (0.5, "none"), (1, "none"), (5, "none"), (20, "none"), (29.9, "none"),  # short runs: no time to overfit
    (30, "light"), (50, "light"), (99, "light"),
    (100, "medium"), (299, "medium"),
    (300, "heavy"), (1000, "heavy"),  # DeiT's transfer runs: 1000 epochs, the full recipe
])
def test_auto_level_follows_the_passes_over_the_training_images(epochs, level):
    assert auto_aug_level(epochs) == level


def test_auto_level_never_weakens_as_the_run_grows():
    levels = [AUG_LEVELS.index(auto_aug_level(e)) for e in (0.1, 1, 3, 10, 30, 60, 100, 200, 500, 5000)]
    assert levels == sorted(levels)


def test_a_steps_run_counts_steps_times_global_batch_over_the_images():
    cfg = FinetuneConfig(dataset="d", steps=100, epochs=1)
    assert cfg.with_aug_resolved(train_images=200, global_batch=64)[0].aug == "light"  # 32 epochs
    assert cfg.with_aug_resolved(train_images=6400, global_batch=64)[0].aug == "none"  # 1 epoch
    resolved, why = FinetuneConfig(dataset="d", epochs=400).with_aug_resolved(train_images=100, global_batch=8)
    assert resolved.aug == "heavy" and "400 epochs over 100 images" in why


def test_a_streamed_split_counts_as_one_pass():
    resolved, why = FinetuneConfig(dataset="d", epochs=500).with_aug_resolved(train_images=None, global_batch=8)
    assert resolved.aug == "none" and "streamed" in why


def test_an_explicit_level_is_kept_whatever_the_budget():
    assert FinetuneConfig(dataset="d", aug="heavy").with_aug_resolved(100, 8)[0].aug == "heavy"
    assert FinetuneConfig(dataset="d", aug="none", epochs=900).with_aug_resolved(100, 8)[0].aug == "none"


def test_flags_given_override_single_settings_of_the_level():
    resolved, _ = FinetuneConfig(dataset="d", scale=(0.5, 1.0), hflip=0.0, aug="heavy").with_aug_resolved(100, 8)
    assert resolved.scale == (0.5, 1.0) and resolved.hflip == 0.0
    assert resolved.mixup == LEVELS["heavy"].mixup  # the rest is the level's
    assert resolved.aug_config() == dataclasses.replace(LEVELS["heavy"], scale=(0.5, 1.0), hflip=0.0)


def test_resolving_twice_gives_the_same_config():
    once, _ = FinetuneConfig(dataset="d", epochs=50).with_aug_resolved(100, 8)
    assert once.with_aug_resolved(100, 8)[0] == once  # what resume compares against the checkpoint
    assert FinetuneConfig.from_dict(once.to_dict()) == once  # config.yaml repeats the run


def test_eval_crop_follows_whether_training_zooms_in():
    none, _ = FinetuneConfig(dataset="d", aug="none").with_aug_resolved(100, 8)
    light, _ = FinetuneConfig(dataset="d", aug="light").with_aug_resolved(100, 8)
    heavy, _ = FinetuneConfig(dataset="d", aug="heavy").with_aug_resolved(100, 8)
    assert none.crop_pct == 1.0 and light.crop_pct == 1.0  # trained on (nearly) whole images
    assert heavy.crop_pct is None  # the model's own centre crop, as for ImageNet-style training
    asked, _ = FinetuneConfig(dataset="d", aug="none", crop_pct=0.9).with_aug_resolved(100, 8)
    assert asked.crop_pct == 0.9


def test_none_is_a_plain_resize_and_heavy_is_deits_recipe():
    none = LEVELS["none"]
    assert (none.scale, none.ratio, none.hflip, none.auto_augment, none.mixup, none.reprob) == \
        ((1.0, 1.0), (1.0, 1.0), 0.0, None, 0.0, 0.0)
    heavy = LEVELS["heavy"]
    assert (heavy.scale, heavy.auto_augment, heavy.reprob, heavy.mixup, heavy.cutmix, heavy.hflip) == \
        ((0.08, 1.0), "rand-m9-mstd0.5-inc1", 0.25, 0.8, 1.0, 0.5)
    strength = [(lv.scale[0], lv.mixup) for lv in (LEVELS[n] for n in AUG_LEVELS)]
    assert [s for s, _ in strength] == sorted((s for s, _ in strength), reverse=True)  # crops widen
    # flips change what a digit or a letter means: only DeiT's own recipe flips
    assert [LEVELS[n].hflip for n in AUG_LEVELS] == [0.0, 0.0, 0.0, 0.5]


def test_resolve_aug_refuses_an_unknown_level():
    with pytest.raises(ValueError, match="unknown augmentation level"):
        resolve_aug("extreme")


@pytest.mark.parametrize("flags, message", [
    (dict(hflip=2.0), "hflip must be a probability"),
    (dict(scale=(1.0, 0.0)), "scale must be two numbers LOW <= HIGH"),
    (dict(crop_pct=0.0), "crop_pct must be in"),
    (dict(crop_pct=5.0), "crop_pct must be in"),
    (dict(mixup=float("inf")), "mixup must be a finite number"),
    (dict(repeated_aug=0), "repeated_aug must be between 1"),
    (dict(val_fraction=1.0), "val_fraction must be between 0 and 1"),
])
def test_out_of_range_augmentation_values_are_config_errors(flags, message):
    from attnft.core.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        FinetuneConfig(dataset="d", **flags)
