"""An image small on disk whose eval resize would be huge (20000x1: 4,480,000x224 at 224 px) is refused before
the resize: skipped with a warning in a data split (training's eval, ``attnft eval``), 413 in the server."""
import logging

import pytest
from PIL import Image

from attnft.data import build_transforms
from attnft.data.images import ImageClassificationDataset
from attnft.data.transforms import ResizeLimit, with_transform

CONFIG = {"input_size": (3, 224, 224), "mean": (0.5,) * 3, "std": (0.5,) * 3, "crop_pct": 1.0, "interpolation": "bicubic"}


def test_the_limit_computes_the_size_timms_eval_resize_gives():
    limit = ResizeLimit(CONFIG)
    assert limit.resized(20_000, 1) == (4_480_000, 224)
    assert limit.resized(448, 224) == (448, 224)
    assert ResizeLimit({**CONFIG, "crop_pct": 0.875}).resized(100, 100) == (256, 256)
    assert ResizeLimit({**CONFIG, "crop_mode": "squash"}).resized(20_000, 1) == (224, 224)


def test_a_thin_image_raises_before_any_resize_and_a_normal_one_passes():
    transform = build_transforms(CONFIG, train=False)
    with pytest.raises(Image.DecompressionBombError, match="would be resized to 4480000x224"):
        transform(Image.new("RGB", (20_000, 1)))
    assert tuple(transform(Image.new("RGB", (300, 200))).shape) == (3, 224, 224)


def test_a_data_split_skips_it_with_a_warning(caplog):
    rows = [{"image": Image.new("RGB", (20_000, 1)), "label": 0}, {"image": Image.new("RGB", (30, 30)), "label": 1}]
    split = with_transform(ImageClassificationDataset(rows, "image", "label", "a test split"),
                           build_transforms(CONFIG, train=False))
    with caplog.at_level(logging.WARNING):
        assert split[0] is None
    assert "skipping sample 0 of a test split" in caplog.text and "would be resized" in caplog.text
    assert split[1][1] == 1
