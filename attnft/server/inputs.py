"""From what a client sent to the tensor a task's model takes, refusing bad input with a one-line reason.

Decoding and preprocessing are ``attnft eval``'s own: :func:`attnft.data.decode_image` (RGB,
alpha on white) and :func:`attnft.data.build_transforms` with the adapter's data config
(input size, mean / std, crop), so a served image meets the model as an evaluated one does.
Serving adds limits: an image whose header claims more than PIL's ``Image.MAX_IMAGE_PIXELS``
is refused before it is decoded, and only common raster formats are tried (no EPS, which
runs Ghostscript). What preprocessing then costs is bounded by the image and the input size,
whatever the image's shape (:mod:`attnft.data.eval_resize`).
"""
from __future__ import annotations

import base64
import binascii
import json
import threading
from typing import Any, Callable, Optional

import torch
from PIL import Image, UnidentifiedImageError

from ..data import build_transforms, decode_image
from ..core.errors import first_line

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "PPM")
DEFAULT_TOP_K = 5


class RequestError(Exception):
    """A request the server refuses: its HTTP status, a short kind (for metrics) and a one-line reason."""

    def __init__(self, status: int, kind: str, message: str, headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, " ".join(message.split())
        self.headers = headers or {}


class Preprocessor:
    """Image bytes -> normalised tensor (3, H, W) for a task's data config; one transform per config, shared."""

    def __init__(self, max_pixels: Optional[int] = None):
        self.max_pixels = max_pixels if max_pixels is not None else Image.MAX_IMAGE_PIXELS
        self._transforms: dict[str, Callable] = {}
        self._lock = threading.Lock()

    def transform(self, data_config: dict) -> Callable:
        key = json.dumps(data_config, sort_keys=True)
        with self._lock:
            if key not in self._transforms:
                self._transforms[key] = build_transforms(dict(data_config), train=False)
            return self._transforms[key]

    def __call__(self, data: bytes, data_config: dict, which: str = "the image") -> torch.Tensor:
        return self.transform(data_config)(open_image(data, self.max_pixels, which))


def open_image(data: bytes, max_pixels: Optional[int], which: str = "the image") -> Image.Image:
    """RGB image of ``data``; RequestError naming ``which`` when it is no image, corrupt, truncated or a bomb."""
    if not data:
        raise RequestError(400, "not_an_image", f"{which} is empty")
    try:
        return decode_image(bytes(data), max_pixels=max_pixels, formats=IMAGE_FORMATS)
    except Image.DecompressionBombError as e:
        raise RequestError(413, "decompression_bomb", f"{which} is refused: {first_line(e)}") from None
    except UnidentifiedImageError:
        raise RequestError(400, "not_an_image", f"{which} is not a {', '.join(IMAGE_FORMATS[:-1])} or {IMAGE_FORMATS[-1]} image") from None
    except Exception as e:  # noqa: BLE001  whatever a malformed file makes a decoder raise is the client's input
        raise RequestError(400, "corrupt_image", f"{which} is truncated or corrupt: {first_line(e)}") from None


def parse_json_body(body: bytes) -> tuple[list[bytes], Optional[Any], bool]:
    """(image bytes, top_k as sent or None, whether it was the batch form) of a JSON body.

    ``{"image": "<base64>", "top_k": 5}`` or ``{"images": ["<base64>", ...], "top_k": 5}``; a
    ``data:image/png;base64,`` prefix is accepted.
    """
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RequestError(400, "bad_json", "the body is not valid JSON") from None
    except RecursionError:  # [[[[...]]]] 100,000 deep: the parser's stack, not ours, is what it attacks
        raise RequestError(400, "bad_json", "the JSON body nests too deeply") from None
    if not isinstance(data, dict) or ("image" not in data and "images" not in data):
        raise RequestError(400, "missing_field", 'a JSON body needs "image" (base64) or "images" (a list of base64 strings)')
    if "image" in data and "images" in data:
        raise RequestError(400, "bad_json", 'send "image" or "images", not both')
    batch = "images" in data
    values = data["images"] if batch else [data["image"]]
    if not isinstance(values, list) or not values:
        raise RequestError(400, "bad_json", '"images" must be a non-empty list of base64 strings')
    images = [_base64(value, f"image {i}" if batch else "image") for i, value in enumerate(values)]
    return images, data.get("top_k"), batch


def _base64(value: Any, which: str) -> bytes:
    if not isinstance(value, str):
        raise RequestError(400, "bad_json", f"{which} must be a base64 string, not {type(value).__name__}")
    if value.startswith("data:") and "," in value:
        value = value.split(",", 1)[1]
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, "bad_base64", f"{which} is not valid base64") from None


def check_top_k(value: Any, num_classes: int) -> int:
    """``value`` as a top-k in 1..num_classes (None: the default, at most ``num_classes``; 0 classes: unknown, no
    upper bound); RequestError otherwise."""
    if value is None:
        return min(DEFAULT_TOP_K, num_classes) if num_classes > 0 else DEFAULT_TOP_K
    if isinstance(value, str) and value.isascii() and value.strip().lstrip("-").isdigit():
        value = int(value)
    limit = num_classes if num_classes > 0 else None  # a config without a class count: the logits decide
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (limit is not None and value > limit):
        allowed = f"from 1 to {limit} (the task's classes)" if limit is not None else "of at least 1"
        raise RequestError(400, "bad_top_k", f"top_k must be an integer {allowed}, got {str(value)[:40]!r}")
    return value
