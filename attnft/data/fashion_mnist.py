"""Fashion-MNIST from its four IDX ``.gz`` files.

Two places hold them: the full set from Debian's ``dataset-fashion-mnist`` package
(60k train / 10k test) and a class-balanced sample shipped inside attnft (written by
``benchmarks/make_fmnist_sample.py``), used when the Debian files are not installed.
"""
import gzip
import os
import struct
import zlib

import numpy as np

from ..core.errors import DataError

DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
BUNDLED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bundled", "fashion-mnist-sample")

LABEL_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)

# pixel mean and std of the 60k train images, on the 0-1 scale
MEAN = 0.2860
STD = 0.3530

# split -> (images file, labels file), the names the official release and Debian use
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

# IDX magic: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions
_IMAGES_MAGIC = 0x00000803
_LABELS_MAGIC = 0x00000801


def _has_all_files(directory: str) -> bool:
    return all(os.path.isfile(os.path.join(directory, name)) for pair in SPLIT_FILES.values() for name in pair)


def fashion_mnist_source(root: str | None = None) -> str:
    """The directory read for ``root``: ``root`` itself, else the Debian dir if complete, else the bundled sample."""
    if root is not None:
        return root
    return DEBIAN_DIR if _has_all_files(DEBIAN_DIR) else BUNDLED_DIR


def _read_idx(path: str, magic: int) -> np.ndarray:
    """One IDX file as a uint8 array whose shape is the header's dimensions."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DataError(f"Fashion-MNIST file not found: {path}") from None
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise DataError(f"corrupt or truncated Fashion-MNIST file {path}: {e}") from None

    if len(data) < 4:
        raise DataError(f"truncated Fashion-MNIST file {path}: {len(data)} bytes, no IDX header")
    (found_magic,) = struct.unpack(">I", data[:4])
    if found_magic != magic:
        raise DataError(f"not an IDX file of the expected kind: {path} (magic 0x{found_magic:08x}, expected 0x{magic:08x})")
    ndim = magic & 0xFF
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise DataError(f"truncated Fashion-MNIST file {path}: {len(data)} bytes, no complete IDX header")
    shape = struct.unpack(f">{ndim}I", data[4:header_size])
    expected = header_size + int(np.prod(shape))
    if len(data) != expected:
        raise DataError(f"truncated or corrupt Fashion-MNIST file {path}: {len(data)} bytes, header {shape} needs {expected}")
    return np.frombuffer(data, dtype=np.uint8, offset=header_size).reshape(shape)


def read_fashion_mnist(split: str, root: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 [N, 28, 28] and labels int64 [N] of ``split`` ("train" or "test").

    ``root`` is a directory holding the four official ``.gz`` files; None picks
    :func:`fashion_mnist_source`'s choice.
    """
    if split not in SPLIT_FILES:
        raise DataError(f"unknown Fashion-MNIST split {split!r}; expected one of {sorted(SPLIT_FILES)}")
    directory = fashion_mnist_source(root)
    images_name, labels_name = SPLIT_FILES[split]
    images_path = os.path.join(directory, images_name)
    labels_path = os.path.join(directory, labels_name)
    images = _read_idx(images_path, _IMAGES_MAGIC)
    labels = _read_idx(labels_path, _LABELS_MAGIC)
    if images.shape[1:] != (28, 28):
        raise DataError(f"Fashion-MNIST images must be 28x28, {images_path} holds {images.shape[1:]}")
    if len(images) != len(labels):
        raise DataError(f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels")
    if labels.size and labels.max() >= len(LABEL_NAMES):
        raise DataError(f"{labels_path} holds label {labels.max()}, Fashion-MNIST has {len(LABEL_NAMES)} classes")
    return images.copy(), labels.astype(np.int64)


def _write_idx(path: str, array: np.ndarray, magic: int) -> None:
    header = struct.pack(f">I{array.ndim}I", magic, *array.shape)
    # mtime=0 and no stored file name so that rewriting the same arrays gives the same bytes
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def write_fashion_mnist(directory: str, split: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Write ``split`` as the two official-format ``.gz`` files in ``directory`` (images [N, 28, 28] uint8)."""
    if split not in SPLIT_FILES:
        raise ValueError(f"unknown split {split!r}")
    if images.shape[1:] != (28, 28) or len(images) != len(labels):
        raise ValueError(f"need images [N, 28, 28] and N labels, got {images.shape} and {labels.shape}")
    os.makedirs(directory, exist_ok=True)
    images_name, labels_name = SPLIT_FILES[split]
    _write_idx(os.path.join(directory, images_name), images, _IMAGES_MAGIC)
    _write_idx(os.path.join(directory, labels_name), labels, _LABELS_MAGIC)
