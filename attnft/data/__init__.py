"""Downstream data: presets, loading any source as train/eval splits, timm transforms and mixup.

Typical use::

    task = load_task("flowers102", data_dir="~/data/flowers")
    train = with_transform(task.train, build_transforms(data_config, train=True, aug=aug))
    loader = DataLoader(train, batch_size, shuffle=True, collate_fn=collate_skipping_failures)
    mixup = make_mixup(aug, task.num_classes)
"""
from .images import (
    ImageClassificationDataset,
    ImageClassificationIterable,
    collate_skipping_failures,
    decode_image,
    flatten,
    to_rgb,
)
from .loading import TaskData, check_batch_size, data_fingerprint, load_task, local_folder, quiet_datasets
from .presets import PRESETS, DatasetPreset, get_preset, takes_inat_category
from .inaturalist import check_inat_category
from .transforms import (
    AugConfig,
    Mixup,
    TransformedDataset,
    TransformedIterable,
    build_transforms,
    check_auto_augment,
    make_mixup,
    with_transform,
)

__all__ = [
    "AugConfig",
    "DatasetPreset",
    "ImageClassificationDataset",
    "ImageClassificationIterable",
    "Mixup",
    "PRESETS",
    "TaskData",
    "TransformedDataset",
    "TransformedIterable",
    "build_transforms",
    "check_auto_augment",
    "check_batch_size",
    "check_inat_category",
    "data_fingerprint",
    "collate_skipping_failures",
    "decode_image",
    "get_preset",
    "load_task",
    "local_folder",
    "make_mixup",
    "quiet_datasets",
    "flatten",
    "takes_inat_category",
    "to_rgb",
    "with_transform",
]
