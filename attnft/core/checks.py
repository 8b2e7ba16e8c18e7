"""The real ranges of what an adapter's config records, checked the same way on save and on read.

Both formats (attnft's ``adapter_config.json`` and a peft adapter's ``attnft.json``) carry a model
name, an input size, classes and their names, and timm's data config; a tampered or broken one
must be refused by ``verify`` with one line, not crash ``eval``, ``show`` or serving later, nor
ask for 13 GB (``input_size`` [3, 200000, 200000]). Pure: no torch, no timm.
"""
from __future__ import annotations

import math
import re
from typing import Any, Optional

from .errors import AdapterError, ConfigError
from .parsing import short

MAX_TEXT_LENGTH = 4096  # a path's PATH_MAX: a model name, a version, a policy spec
MEAN_RANGE = (-10.0, 10.0)  # of a data config, on pixels in [0, 1] (timm's are within 0-1)
STD_RANGE = (1e-3, 100.0)
MAX_INPUT_SIDE = 4096  # pixels: 65k tokens at 16 px patches, beyond any ViT's fine-tuning size
MAX_CLASSES = 1_000_000
MIN_CROP_PCT = 0.1  # the eval resize is res / crop_pct: below this the images only grow out of memory
CROP_MODES = ("center", "squash", "border")
# timm's resize interpolations (timm.data.transforms.str_to_interp_mode) plus its "random" mix of
# bilinear and bicubic; kept here so that the CLI need not import timm (a test keeps them in step)
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos", "random")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
PRECISIONS = ("no", "bf16", "fp16")  # --precision of training, eval and serving
_HEX64 = re.compile(r"[0-9a-f]{64}")


class Fields:
    """Checks fields of one config, each failure an AdapterError naming ``source`` and the field."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, name: str, why: str) -> None:
        raise AdapterError(f"{self.source}: {name} {why}")

    def text(self, name: str, value: Any, *, empty: bool = False, max_length: int = MAX_TEXT_LENGTH) -> None:
        if not isinstance(value, str) or (not empty and not value.strip()):
            self.fail(name, f"must be {'' if empty else 'non-empty '}text, got {_short(value)}")
        if len(value) > max_length:
            self.fail(name, f"must be at most {max_length:,} characters, got {len(value):,}")

    def integer(self, name: str, value: Any, low: int, high: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(name, f"must be an integer from {low} to {high:,}, got {_short(value)}")

    def mapping(self, name: str, value: Any) -> None:
        if not isinstance(value, dict):
            self.fail(name, f"must be a JSON object, got {_short(value)}")

    def hex64(self, name: str, value: Any) -> None:
        if not isinstance(value, str) or not _HEX64.fullmatch(value):
            self.fail(name, f"must be a sha256 hex digest (64 characters 0-9a-f), got {_short(value)}")

    def labels(self, value: Any, num_classes: Optional[int]) -> None:
        if value is None:
            return
        if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
            self.fail("label_names", f"must be a list of names, got {_short(value)}")
        if num_classes is not None and len(value) != num_classes:
            self.fail("label_names", f"has {len(value)} label names for {num_classes} classes")

    def data_config(self, value: Any, input_size: Optional[int]) -> None:
        """timm's data config at the adapter's size, plus attnft's ``background``."""
        self.mapping("data_config", value)
        size = value.get("input_size")
        if (not isinstance(size, list) or len(size) != 3 or not all(_is_int(v) for v in size)
                or size[0] not in (1, 3) or not all(1 <= v <= MAX_INPUT_SIDE for v in size[1:])):
            self.fail("data_config.input_size", f"must be [3, H, W] with H, W from 1 to {MAX_INPUT_SIDE}, got {_short(size)}")
        if input_size is not None and (size[1] != input_size or size[2] != input_size):
            self.fail("data_config.input_size", f"is {size[1]}x{size[2]} px, not the adapter's input_size "
                      f"{input_size}x{input_size}")
        # pixels are in [0, 1] before normalising: a mean or std far outside it makes every logit inf or NaN
        for key, (low, high) in (("mean", MEAN_RANGE), ("std", STD_RANGE)):
            numbers = value.get(key)
            if (not isinstance(numbers, list) or len(numbers) not in (1, 3) or not all(_is_number(v) for v in numbers)
                    or not all(low <= v <= high for v in numbers)):
                self.fail(f"data_config.{key}", f"must be 1 or 3 numbers from {low:g} to {high:g}, got {_short(numbers)}")
        crop = value.get("crop_pct", 1.0)
        if crop is not None and (not _is_number(crop) or not MIN_CROP_PCT <= crop <= 1):
            self.fail("data_config.crop_pct", f"must be in [{MIN_CROP_PCT}, 1], got {_short(crop)}")
        self.choice("data_config.crop_mode", value.get("crop_mode"), CROP_MODES)
        self.choice("data_config.interpolation", value.get("interpolation"), INTERPOLATIONS)
        background = value.get("background")
        if background is not None and (not isinstance(background, list) or len(background) != 3
                                       or not all(_is_int(v) and 0 <= v <= 255 for v in background)):
            self.fail("data_config.background", f"must be three integers 0-255, got {_short(background)}")

    def choice(self, name: str, value: Any, choices: tuple, optional: bool = True) -> None:
        if (value is None and optional) or (isinstance(value, str) and value in choices):
            return
        self.fail(name, f"must be one of {', '.join(choices)}, got {_short(value)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _short(value: Any, limit: int = 60) -> str:
    return short(value if not isinstance(value, str) else repr(value), limit)


def require(condition: bool, message: str) -> None:
    """ConfigError(``message``) unless ``condition``: one flag's range, checked at the edge."""
    if not condition:
        raise ConfigError(message)


def check_type(value: Any, kinds, name: str, expected: str) -> None:
    """TypeError naming the argument (as timm and peft do) unless ``value`` is one of ``kinds``: a caller's mistake in
    Python, said before it becomes an AttributeError deep inside."""
    if not isinstance(value, kinds):
        raise TypeError(f"{name} must be {expected}, not {type(value).__name__}")
