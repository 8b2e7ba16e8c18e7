"""The eval resize and centre crop cost what the image and the output cost, whatever the image's shape: timm's
resize-then-crop would make a 100000x1 PNG 22,400,000x224 pixels at 224 px before keeping 224x224 of it. Ordinary
images get timm's eval transform bit for bit; extreme ones resample only the crop's box in the source."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform

from attnft.data import build_transforms
from attnft.data.eval_resize import ResizeCenterCrop, resample_box
from attnft.data.images import ImageClassificationDataset
from attnft.data.transforms import with_transform

ROOT = Path(__file__).resolve().parents[1]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SHAPES = [(640, 480), (480, 640), (500, 375), (333, 1000), (1000, 333), (300, 200), (257, 256), (1920, 1080), (28, 28)]
CONFIGS = [((224, 224), 1.0, "bicubic"), ((224, 224), 0.875, "bilinear"), ((28, 28), 1.0, "bicubic"),
           ((384, 384), 0.9, "bicubic"), ((224, 160), 0.9, "bicubic")]


def _config(size, crop_pct, interpolation) -> dict:
    return {"input_size": (3, *size), "mean": MEAN, "std": STD, "crop_pct": crop_pct, "interpolation": interpolation}


def _noise(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _smooth(width: int, height: int, seed: int = 0) -> Image.Image:
    """A photo-like image: coarse noise upscaled."""
    coarse = _noise(max(width // 8, 2), max(height // 8, 2), seed)
    return coarse.resize((width, height), Image.Resampling.BICUBIC)


@pytest.mark.parametrize("size, crop_pct, interpolation", CONFIGS)
def test_an_ordinary_image_gets_timms_eval_transform_bit_for_bit(size, crop_pct, interpolation):
    config = _config(size, crop_pct, interpolation)
    ours = build_transforms(config, train=False)
    timms = create_transform(input_size=config["input_size"], is_training=False, interpolation=interpolation,
                             crop_pct=crop_pct, mean=MEAN, std=STD)
    for seed, (width, height) in enumerate(SHAPES):
        image = _noise(width, height, seed)
        expected = timms(image)
        got = ours(image)
        assert got.shape == expected.shape == (3, *size)
        assert torch.equal(got, expected), (width, height)


@pytest.mark.parametrize("width, height", [(2000, 3), (3, 2000), (640, 480), (480, 640), (333, 1000), (1000, 333)])
def test_resampling_only_the_crops_box_gives_the_whole_resizes_crop_within_rounding(width, height):
    """The path an extreme shape takes, on shapes where the whole resize is affordable: a level of 255 or two apart
    in a few pixels (the box's float32 corners; PIL may run its two passes in the other order)."""
    image = _smooth(width, height)
    for size in (28, 224):
        timms = create_transform(input_size=(3, size, size), is_training=False, interpolation="bicubic", crop_pct=1.0)
        expected = np.asarray(timms.transforms[1](timms.transforms[0](image)), dtype=np.int16)
        crop = ResizeCenterCrop((size, size), 1.0)
        got = np.asarray(resample_box(image, crop.crop_box(width, height), (size, size), Image.Resampling.BICUBIC),
                         dtype=np.int16)
        difference = np.abs(got - expected)
        assert difference.max() <= 2 and difference.mean() < 0.25, (size, difference.max(), difference.mean())


def test_the_crop_box_is_where_timms_crop_lies_in_the_source():
    crop = ResizeCenterCrop((224, 224), 1.0)
    assert crop.resized(20_000, 1) == (4_480_000, 224)
    assert crop.crop_box(20_000, 1) == pytest.approx((2_239_888 / 224, 0, 2_240_112 / 224, 1))
    assert ResizeCenterCrop((224, 224), 0.875).resized(100, 100) == (256, 256)
    assert ResizeCenterCrop((224, 224), 0.875).crop_box(100, 100) == pytest.approx((16 / 2.56, 16 / 2.56, 240 / 2.56,
                                                                                    240 / 2.56))


_PEAK = textwrap.dedent("""
    import sys
    from PIL import Image
    from attnft.data import build_transforms

    def peak_mb():
        line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024

    size = int(sys.argv[1])
    config = {"input_size": (3, size, size), "mean": (0.5,) * 3, "std": (0.5,) * 3, "crop_pct": 1.0,
              "interpolation": "bicubic"}
    transform = build_transforms(config, train=False)
    transform(Image.new("RGB", (300, 200)))
    thin = [Image.new("RGB", (100_000, 1), (10, 200, 30)), Image.new("RGB", (1, 100_000), (10, 200, 30))]
    before = peak_mb()
    shapes = [tuple(transform(image).shape) for image in thin]
    print(shapes, peak_mb() - before)
""")


@pytest.mark.parametrize("size", [224, 28])
def test_a_100000x1_and_a_1x100000_image_cost_their_source_and_output_not_their_resize(size):
    """Before, 100000x1 at 28 px was resized to 2,800,000x28 (235 MB of RGB) and at 224 px refused (it would have
    been 5 billion pixels): now each is its crop of the source, resampled."""
    result = subprocess.run([sys.executable, "-c", _PEAK, str(size)], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stderr[-2000:]
    shapes, grown = result.stdout.rsplit(maxsplit=1)[0], float(result.stdout.split()[-1])
    assert shapes == str([(3, size, size)] * 2)
    assert grown < 20, f"peak RSS grew {grown:.0f} MB"


def test_a_data_split_evaluates_a_thin_image_as_any_other():
    config = _config((224, 224), 1.0, "bicubic")
    rows = [{"image": Image.new("RGB", (20_000, 1), (255, 0, 0)), "label": 0},
            {"image": Image.new("RGB", (30, 30)), "label": 1}]
    split = with_transform(ImageClassificationDataset(rows, "image", "label", "a test split"),
                           build_transforms(config, train=False))
    thin, label = split[0]
    red = (torch.tensor([1.0, 0.0, 0.0]) - torch.tensor(MEAN)) / torch.tensor(STD)
    assert label == 0 and thin.shape == (3, 224, 224)
    torch.testing.assert_close(thin, red.view(3, 1, 1).expand(3, 224, 224))
    assert split[1][1] == 1
