"""The bundled pretrained ViTs and the Fashion-MNIST reader, offline."""
import gzip
import hashlib
import os

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import load_file
from timm.layers import resample_abs_pos_embed

from attnft.bundled import BUNDLED_MODEL_28, BUNDLED_MODELS, bundled_facts, weights_path
from attnft.data.fashion_mnist import (
    BUNDLED_DIR, DEBIAN_DIR, LABEL_NAMES, SPLIT_FILES, fashion_mnist_source, read_fashion_mnist, write_fashion_mnist,
)
from attnft.core.errors import DataError

# measured 90.5% on the sample's 1000 test images (see the bundled JSON); floor a little below
SAMPLE_ACCURACY_FLOOR = 89.0

debian_installed = pytest.mark.skipif(
    not all(os.path.isfile(os.path.join(DEBIAN_DIR, n)) for pair in SPLIT_FILES.values() for n in pair),
    reason="dataset-fashion-mnist is not installed",
)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _accuracy(model, images: np.ndarray, labels: np.ndarray) -> float:
    mean = torch.tensor(model.pretrained_cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(model.pretrained_cfg["std"]).view(1, 3, 1, 1)
    x = (torch.from_numpy(images).float().div(255).unsqueeze(1).expand(-1, 3, -1, -1) - mean) / std
    with torch.no_grad():
        predicted = model.eval()(x).argmax(-1).numpy()
    return 100.0 * (predicted == labels).mean()


def test_bundled_model_is_a_pretrained_timm_model_with_a_local_file():
    cfg = timm.models.get_pretrained_cfg(BUNDLED_MODEL_28)
    assert BUNDLED_MODEL_28 in timm.list_models(pretrained=True, include_tags=False)
    assert cfg.file == weights_path(BUNDLED_MODEL_28) and os.path.isfile(cfg.file)
    assert cfg.hf_hub_id is None and cfg.url is None
    assert cfg.input_size == (3, 28, 28) and cfg.num_classes == len(LABEL_NAMES)
    assert tuple(cfg.label_names) == LABEL_NAMES


def test_bundled_model_classifies_the_shipped_sample_above_the_floor():
    model = timm.create_model(BUNDLED_MODEL_28, pretrained=True)
    images, labels = read_fashion_mnist("test", BUNDLED_DIR)
    assert _accuracy(model, images, labels) >= SAMPLE_ACCURACY_FLOOR


@pytest.mark.parametrize("name", BUNDLED_MODELS)
def test_bundled_facts_describe_the_shipped_weights_and_the_accuracy_they_measure_on_the_sample(name):
    facts = bundled_facts(name)
    model = timm.create_model(name, pretrained=True)
    with open(weights_path(name), "rb") as f:
        assert facts["weights_sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert facts["weights_bytes"] == os.path.getsize(weights_path(name))
    assert facts["parameters"] == sum(p.numel() for p in model.parameters())
    assert facts["architecture"]["img_size"] == model.patch_embed.img_size[0]
    assert facts["architecture"]["patch_size"] == model.patch_embed.patch_size[0]
    images, labels = read_fashion_mnist("test", BUNDLED_DIR)
    size = model.patch_embed.img_size[0]
    if size != images.shape[-1]:  # upscaled by PIL bicubic, as the recipe and attnft's eval transform do
        images = np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BICUBIC)) for im in images])
    assert _accuracy(model, images, labels) == pytest.approx(facts["sample_test_accuracy"], abs=0.01)


def test_bundled_model_at_double_resolution_gets_a_resampled_pos_embed():
    stored = load_file(weights_path(BUNDLED_MODEL_28))["pos_embed"]  # [1, 1 + 7*7, D]
    model = timm.create_model(BUNDLED_MODEL_28, pretrained=True, img_size=56)
    expected = resample_abs_pos_embed(stored, new_size=(14, 14), old_size=(7, 7), num_prefix_tokens=1)
    assert model.pos_embed.shape == (1, 1 + 14 * 14, stored.shape[-1])
    torch.testing.assert_close(model.pos_embed.data, expected)
    assert model(torch.zeros(2, 3, 56, 56)).shape == (2, len(LABEL_NAMES))


def test_reader_parses_the_bundled_sample_class_balanced():
    for split, size in (("train", 5000), ("test", 1000)):
        images, labels = read_fashion_mnist(split, BUNDLED_DIR)
        assert images.shape == (size, 28, 28) and images.dtype == np.uint8
        assert labels.shape == (size,) and labels.dtype == np.int64
        assert np.bincount(labels).tolist() == [size // 10] * 10


@debian_installed
def test_reader_parses_the_debian_files_and_the_sample_is_their_subset():
    images, labels = read_fashion_mnist("test")
    assert fashion_mnist_source() == DEBIAN_DIR
    assert images.shape == (10000, 28, 28) and labels.shape == (10000,)
    sample_images, sample_labels = read_fashion_mnist("test", BUNDLED_DIR)
    first_100_of_each = np.sort(np.concatenate([np.flatnonzero(labels == c)[:100] for c in range(10)]))
    np.testing.assert_array_equal(sample_images, images[first_100_of_each])
    np.testing.assert_array_equal(sample_labels, labels[first_100_of_each])


def test_reader_round_trips_what_it_writes(tmp_path):
    images = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
    labels = np.array([9, 0, 4])
    write_fashion_mnist(str(tmp_path), "test", images, labels)
    read_images, read_labels = read_fashion_mnist("test", str(tmp_path))
    np.testing.assert_array_equal(read_images, images)
    np.testing.assert_array_equal(read_labels, labels)


def _write_tiny_split(directory) -> str:
    write_fashion_mnist(str(directory), "train", np.zeros((4, 28, 28), np.uint8), np.array([0, 1, 2, 3]))
    return os.path.join(str(directory), SPLIT_FILES["train"][0])


def test_reader_rejects_a_truncated_gzip_file_naming_it(tmp_path):
    images_path = _write_tiny_split(tmp_path)
    with open(images_path, "rb") as f:
        data = f.read()
    with open(images_path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(DataError, match=images_path):
        read_fashion_mnist("train", str(tmp_path))


def test_reader_rejects_fewer_pixels_than_the_header_states(tmp_path):
    images_path = _write_tiny_split(tmp_path)
    with gzip.open(images_path, "rb") as f:
        data = f.read()
    with gzip.open(images_path, "wb") as f:
        f.write(data[:-28])
    with pytest.raises(DataError, match="truncated"):
        read_fashion_mnist("train", str(tmp_path))


def test_reader_rejects_a_labels_file_in_place_of_images(tmp_path):
    images_path = _write_tiny_split(tmp_path)
    os.replace(os.path.join(str(tmp_path), SPLIT_FILES["train"][1]), images_path)
    with pytest.raises(DataError, match="magic"):
        read_fashion_mnist("train", str(tmp_path))


def test_reader_rejects_an_unknown_split():
    with pytest.raises(DataError, match="split"):
        read_fashion_mnist("validation")


def test_source_is_the_given_root_else_debian_else_the_sample(tmp_path):
    assert fashion_mnist_source(str(tmp_path)) == str(tmp_path)
    assert fashion_mnist_source() in (DEBIAN_DIR, BUNDLED_DIR)
