"""Decoding images to RGB, lazily, skipping the ones that cannot be read.

Every split a task hands out is one of the two wrappers here: they turn rows of a
Hugging Face dataset (or of in-memory arrays) into ``(PIL image, int label)``, the image RGB, or
RGBA where it has transparency: which colour a transparent pixel becomes is a property of the
data and the base, so the transform flattens it onto the data config's ``background``
(:func:`attnft.data.transforms.build_transforms`), not this module onto one constant.
Images are decoded in ``__getitem__`` / ``__iter__``, so an unreadable file costs
one warning and one sample, never the run: the map-style wrapper returns ``None``
for it and :func:`collate_skipping_failures` drops it from the batch; the iterable
wrapper simply does not yield it.
"""
import io
import logging
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset, IterableDataset, default_collate

logger = logging.getLogger(__name__)

Sample = tuple[Image.Image, int]

# What a transparent pixel became before the background was part of the data config: adapters
# saved then have no ``background`` and keep this one.
WHITE = (255, 255, 255)


def to_rgb_or_rgba(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB, or RGBA if it has transparency: grayscale, palette, CMYK and 16-bit modes converted."""
    if image.mode == "RGB" and "transparency" not in image.info:
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        # PIL's own I;16 -> RGB conversion clips at 255 instead of scaling
        array = np.asarray(image, dtype=np.uint16) >> 8
        return Image.fromarray(array.astype(np.uint8)).convert("RGB")
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
        return image.convert("RGBA")
    return image.convert("RGB")


def flatten(image: Image.Image, background: tuple[int, int, int] = WHITE) -> Image.Image:
    """An RGB or RGBA image as RGB, its transparent pixels composited onto ``background`` (0-255 each)."""
    if image.mode == "RGB":
        return image
    rgba = image.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, tuple(background) + (255,)), rgba).convert("RGB")


def to_rgb(image: Image.Image, background: tuple[int, int, int] = WHITE) -> Image.Image:
    """``image`` as 8-bit RGB, any transparency composited onto ``background``."""
    return flatten(to_rgb_or_rgba(image), background)


def decode_image(value: Any, *, max_pixels: int | None = None, formats: Sequence[str] | None = None) -> Image.Image:
    """Decode one stored image to RGB, or RGBA where it has transparency (:func:`to_rgb_or_rgba`).

    ``value`` is what a dataset row holds: a ``datasets.Image(decode=False)`` dict
    (``bytes`` and/or ``path``), a path, raw bytes, a uint8 array [H, W] or [H, W, C],
    or a PIL image. Raises whatever PIL raises for unreadable data. ``max_pixels``: an image
    whose header claims more pixels raises ``Image.DecompressionBombError`` before it is
    decoded (PIL itself only warns below twice its ``MAX_IMAGE_PIXELS``); ``formats``: the PIL
    formats tried (None: every one PIL has).
    """
    try:
        image = _open(value, formats)
    except Image.DecompressionBombError as e:  # PIL refuses beyond twice its limit, quoting that: say ours, once
        size = re.search(r"\((\d+) pixels\)", str(e))
        limit = max_pixels if max_pixels is not None else Image.MAX_IMAGE_PIXELS
        raise Image.DecompressionBombError(
            f"image of {int(size.group(1)):,} pixels is over the limit of {limit:,} pixels: a decompression bomb?"
            if size else f"image is over the limit of {limit:,} pixels: a decompression bomb?") from None
    if max_pixels is not None and image.width * image.height > max_pixels:
        raise Image.DecompressionBombError(
            f"image of {image.width}x{image.height} pixels is over the limit of {max_pixels:,} pixels: a decompression bomb?"
        )
    image.load()  # open() is lazy: truncated or corrupt data only fails here
    return to_rgb_or_rgba(image)


def _open(value: Any, formats: Sequence[str] | None) -> Image.Image:
    """The PIL image of a stored value, opened (lazily: its header only)."""
    if isinstance(value, Image.Image):
        image = value
    elif isinstance(value, (np.ndarray, list)):  # arrays, or Array features read as nested lists
        image = Image.fromarray(np.asarray(value, dtype=np.uint8))
    elif isinstance(value, (bytes, bytearray)):
        image = Image.open(io.BytesIO(value), formats=formats)
    elif isinstance(value, (str, os.PathLike)):
        image = Image.open(value, formats=formats)
    elif isinstance(value, dict):
        if value.get("bytes") is not None:
            image = Image.open(io.BytesIO(value["bytes"]), formats=formats)
        elif value.get("path") is not None:
            image = Image.open(value["path"], formats=formats)
        else:
            raise ValueError("image entry has neither bytes nor path")
    else:
        raise TypeError(f"cannot decode an image from {type(value).__name__}")
    return image


def describe_image(value: Any, index: int, source: str) -> str:
    """How to name a sample in a warning: its file path if it is a file, else its index in ``source``
    (with the file name the bytes were stored under, when the dataset kept one)."""
    path = value.get("path") if isinstance(value, dict) else value if isinstance(value, (str, os.PathLike)) else None
    if path and os.path.isabs(path):
        return str(path)
    return f"{path} (sample {index} of {source})" if path else f"sample {index} of {source}"


# Errors that mean "this sample's data is bad", as opposed to a bug in our code.
_UNREADABLE = (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError, EOFError)


class _Decoder:
    """Decodes rows and warns once per unreadable image (per process: DataLoader workers each keep their own)."""

    def __init__(self, image_key: str, label_key: str, source: str):
        self.image_key = image_key
        self.label_key = label_key
        self.source = source
        self.skipped: set[str] = set()

    def decode(self, row: dict, index: int) -> Sample | None:
        value = row[self.image_key]
        try:
            image = decode_image(value)
        except _UNREADABLE as error:
            where = describe_image(value, index, self.source)
            if where not in self.skipped:
                self.skipped.add(where)
                logger.warning("skipping unreadable image %s: %s", where, error)
            return None
        return image, int(row[self.label_key])


class _DecodedRows:
    """What both kinds of split share: the decoder of their rows, the source it names, the images it skipped."""

    _decoder: "_Decoder"

    @property
    def source(self) -> str:
        return self._decoder.source

    @property
    def skipped(self) -> set[str]:
        """Images found unreadable so far in this process (paths, or sample descriptions)."""
        return self._decoder.skipped


class ImageClassificationDataset(_DecodedRows, Dataset):
    """Map-style split: item ``i`` is ``(PIL RGB or RGBA image, int label)``, or ``None`` if the image is unreadable.

    ``rows`` is anything indexable by int that returns dicts (a ``datasets.Dataset``
    whose image column has ``decode=False``, or :class:`ArrayRows`). ``indices``
    selects a subset of it without copying.
    """

    def __init__(self, rows, image_key: str, label_key: str, source: str, indices: Sequence[int] | None = None):
        self.rows = rows
        self.indices = indices
        self._decoder = _Decoder(image_key, label_key, source)

    def __len__(self) -> int:
        return len(self.indices) if self.indices is not None else len(self.rows)

    def __getitem__(self, index: int) -> Sample | None:
        row_index = int(self.indices[index]) if self.indices is not None else index
        return self._decoder.decode(self.rows[row_index], row_index)

    def subset(self, size: int, seed: int = 0) -> "ImageClassificationDataset":
        """A seeded random subset of ``size`` samples (all of them if ``size`` >= len)."""
        if size >= len(self):
            return self
        order = np.random.default_rng(seed).permutation(len(self))[:size]
        base = np.asarray(self.indices)[order] if self.indices is not None else order
        return ImageClassificationDataset(
            self.rows, self._decoder.image_key, self._decoder.label_key, self.source, np.sort(base).tolist()
        )


class ImageClassificationIterable(_DecodedRows, IterableDataset):
    """Streaming split: yields ``(PIL RGB or RGBA image, int label)`` and silently drops unreadable images after warning.

    ``rows`` is a ``datasets.IterableDataset`` (image column with ``decode=False``); it
    shards itself across DataLoader workers, and :meth:`set_epoch` reshuffles it.
    """

    def __init__(self, rows, image_key: str, label_key: str, source: str):
        self.rows = rows
        self._decoder = _Decoder(image_key, label_key, source)


    def set_epoch(self, epoch: int) -> None:
        self.rows.set_epoch(epoch)

    def __iter__(self) -> Iterator[Sample]:
        for index, row in enumerate(self.rows):
            sample = self._decoder.decode(row, index)
            if sample is not None:
                yield sample


class ArrayRows:
    """In-memory images uint8 [N, H, W(, C)] and labels [N] seen as rows ``{"image", "label"}``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        return {"image": self.images[index], "label": int(self.labels[index])}


def collate_skipping_failures(batch: list) -> Any:
    """``default_collate`` after dropping the ``None`` of unreadable samples; ``None`` if nothing is left."""
    kept = [sample for sample in batch if sample is not None]
    if not kept:
        return None
    return default_collate(kept)
