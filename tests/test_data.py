"""attnft.data: loading every kind of source offline, RGB decoding, skipping bad images, errors, transforms."""
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import datasets
import huggingface_hub
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image as ImageFeature, Value
from PIL import Image
from torch.utils.data import DataLoader

from attnft.data import (
    PRESETS,
    AugConfig,
    build_transforms,
    check_batch_size,
    collate_skipping_failures,
    get_preset,
    load_task,
    make_mixup,
    to_rgb,
    flatten,
    with_transform,
)
from attnft.data import fashion_mnist
from attnft.data.presets import HUB
from attnft.core.errors import ConfigError, DataError

COLORS = {"cat": (200, 30, 30), "dog": (30, 30, 200), "owl": (30, 200, 30)}


@pytest.fixture(autouse=True)
def isolated_offline_datasets(tmp_path, monkeypatch):
    """Arrow caches go to tmp_path, and nothing may reach the hub."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def write_image_folder(root, splits=("train", "val"), classes=("cat", "dog"), per_class=3, size=12):
    """root/<split>/<class>/<i>.png, each image filled with its class colour."""
    for split in splits:
        for name in classes:
            os.makedirs(root / split / name, exist_ok=True)
            for i in range(per_class):
                Image.new("RGB", (size, size + i), COLORS[name]).save(root / split / name / f"{i}.png")
    return root


def image_dataset(count, label_names, extra=None):
    """An in-memory datasets.Dataset with an Image column and a ClassLabel column."""
    columns = {"image": [Image.new("RGB", (10, 10), (i * 20 % 255, 0, 0)) for i in range(count)],
               "label": [i % len(label_names) for i in range(count)]}
    features = {"image": ImageFeature(), "label": ClassLabel(names=label_names)}
    for name, (values, feature) in (extra or {}).items():
        columns[name], features[name] = values, feature
    return Dataset.from_dict(columns, features=Features(features))


def all_samples(split):
    return [split[i] for i in range(len(split))]


# ---- sources ------------------------------------------------------------------------------------

def test_image_folder_with_train_and_val_gives_rgb_images_and_folder_class_names(tmp_path):
    root = write_image_folder(tmp_path / "pets", classes=("cat", "dog", "owl"))
    task = load_task(str(root))
    assert task.label_names == ["cat", "dog", "owl"] and task.num_classes == 3
    assert (len(task.train), len(task.eval)) == (9, 9)
    assert task.name == "pets" and str(root) in task.source
    for image, label in all_samples(task.train):
        assert image.mode == "RGB"
        assert image.getpixel((0, 0)) == COLORS[task.label_names[label]]


def test_image_folder_with_test_instead_of_val_uses_test_for_eval(tmp_path):
    root = write_image_folder(tmp_path / "f", splits=("train", "test"), per_class=2)
    task = load_task(data_dir=str(root))
    assert (len(task.train), len(task.eval)) == (4, 4)


def test_saved_datasetdict_directory_is_read_with_load_from_disk(tmp_path):
    saved = DatasetDict(train=image_dataset(6, ["a", "b"]), validation=image_dataset(4, ["a", "b"]))
    saved.save_to_disk(tmp_path / "saved")
    task = load_task(str(tmp_path / "saved"))
    assert (len(task.train), len(task.eval), task.label_names) == (6, 4, ["a", "b"])
    image, label = task.eval[1]
    assert image.mode == "RGB" and image.size == (10, 10) and label == 1


FLOWERS_SPLITS = {"train": 1020, "validation": 1020, "test": 6149}  # the official setid split


def pixel_splits(sizes: dict, label_names: list[str]) -> dict:
    """{split: a datasets.Dataset of that many 2x2 images}, labels cycling through ``label_names``."""
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=label_names)})
    pixel = Image.new("RGB", (2, 2))
    return {split: Dataset.from_dict({"image": [pixel] * n, "label": [i % len(label_names) for i in range(n)]},
                                     features=features) for split, n in sizes.items()}


def test_local_copy_of_a_hub_repo_loads_with_a_presets_splits_and_keys(tmp_path):
    # flowers102 trains on train+validation; the repo's other splits are not read
    repo = tmp_path / "flowers"
    os.makedirs(repo / "data")
    for split, rows in pixel_splits(FLOWERS_SPLITS, ["rose", "tulip"]).items():
        rows.to_parquet(repo / "data" / f"{split}-00000-of-00001.parquet")
    (repo / "data" / "contrast-00000-of-00001.parquet").write_bytes(b"not parquet: fails if read")
    task = load_task("flowers102", data_dir=str(repo))
    assert (len(task.train), len(task.eval)) == (2040, 6149)
    assert task.name == "flowers102" and task.label_names == ["rose", "tulip"]


def test_image_and_label_columns_are_found_by_their_feature_types(tmp_path):
    data = image_dataset(4, ["x", "y"]).rename_columns({"image": "picture", "label": "category"})
    DatasetDict(train=data, test=data).save_to_disk(tmp_path / "d")
    task = load_task(str(tmp_path / "d"))
    assert task.label_names == ["x", "y"] and task.train[0][0].mode == "RGB"


def test_integer_and_string_labels_get_class_names(tmp_path):
    ints = image_dataset(4, ["a", "b"]).cast_column("label", Value("int64"))
    DatasetDict(train=ints, test=ints).save_to_disk(tmp_path / "ints")
    assert load_task(str(tmp_path / "ints")).label_names == ["0", "1"]
    strings = image_dataset(4, ["a", "b"]).remove_columns("label").add_column("label", ["b", "a", "c", "a"])
    DatasetDict(train=strings, test=strings).save_to_disk(tmp_path / "strings")
    task = load_task(str(tmp_path / "strings"))
    assert task.label_names == ["a", "b", "c"] and task.train[2][1] == 2


def test_max_train_and_max_eval_keep_a_seeded_subset(tmp_path):
    root = write_image_folder(tmp_path / "f", per_class=5)
    first = load_task(str(root), max_train=4, max_eval=3)
    again = load_task(str(root), max_train=4, max_eval=3)
    assert (len(first.train), len(first.eval)) == (4, 3)
    assert [label for _, label in all_samples(first.train)] == [label for _, label in all_samples(again.train)]


def test_streaming_an_image_folder_yields_every_image(tmp_path):
    root = write_image_folder(tmp_path / "f", per_class=4)
    task = load_task(str(root), streaming=True)
    assert task.streaming
    labels = sorted(label for _, label in task.train)
    assert labels == [0] * 4 + [1] * 4


def test_fashion_mnist_is_the_default_dataset():
    if not any(os.path.isfile(os.path.join(d, "train-images-idx3-ubyte.gz"))
               for d in (fashion_mnist.DEBIAN_DIR, fashion_mnist.BUNDLED_DIR)):
        pytest.skip("neither the Debian Fashion-MNIST files nor the bundled sample are present")
    task = load_task(max_train=16, max_eval=8)
    assert task.name == "fashion-mnist" and task.num_classes == 10
    assert task.label_names == list(fashion_mnist.LABEL_NAMES)
    assert (len(task.train), len(task.eval)) == (16, 8)
    image, label = task.train[0]
    assert image.mode == "RGB" and image.size == (28, 28) and 0 <= label < 10


# ---- presets ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(n for n, p in PRESETS.items() if p.layout == HUB))
def test_a_hub_preset_reads_its_own_splits_and_columns_from_a_local_copy(tmp_path, name):
    """A copy holding decoys (another split, a second image and label column) loads only what the preset names."""
    preset = get_preset(name)
    sizes = {"train": 4, "validation": 3, "test": 5, "extra": 2, **dict(preset.split_sizes)}  # checked on load
    decoys = {"thumbnail": (Image.new("RGB", (3, 3)), ImageFeature()), "decoy_label": (2, ClassLabel(names=["x", "y", "z"]))}
    splits = {}
    for split, count in sizes.items():
        data = image_dataset(count, ["a", "b"], extra={k: ([v] * count, f) for k, (v, f) in decoys.items()})
        splits[split] = data.rename_columns({"image": preset.image_key, "label": preset.label_key}) \
            if preset.image_key != "image" or preset.label_key != "label" else data
    DatasetDict(splits).save_to_disk(tmp_path / "copy")
    task = load_task(name, data_dir=str(tmp_path / "copy"))
    assert len(task.train) == sum(sizes[s] for s in preset.train_split.split("+"))
    assert len(task.eval) == sizes[preset.eval_split]
    assert task.label_names == ["a", "b"]  # the preset's label column, not the decoy
    image, label = task.train[0]
    assert image.size == (10, 10) and label == 0  # the preset's image column, not the thumbnail


def test_presets_cover_the_papers_transfer_datasets():
    assert {"cars", "flowers102", "inat2018", "inat2019", "inat2021", "cifar10", "cifar100", "pets",
            "food101", "fashion-mnist"} <= set(PRESETS)
    assert get_preset("inat2021").streaming and not get_preset("inat2018").streaming


def write_inat_json(root, categories, split_images, taxonomy=None):
    """An iNaturalist 2018 json-layout copy: ``{split: [(category id, file stem)]}``, images red by category."""
    image_id = 0
    for split, items in split_images.items():
        images, annotations = [], []
        for category, stem in items:
            file_name = f"train_val2018/Life/{category}/{stem}.jpg"
            os.makedirs(root / os.path.dirname(file_name), exist_ok=True)
            Image.new("RGB", (9, 9), (category * 10, 0, 0)).save(root / file_name)
            images.append({"id": image_id, "file_name": file_name, "width": 9, "height": 9})
            annotations.append({"id": image_id, "image_id": image_id, "category_id": category})
            image_id += 1
        (root / f"{split}.json").write_text(json.dumps(
            {"images": images, "annotations": annotations, "categories": categories}))
    if taxonomy is not None:
        (root / "categories.json").write_text(json.dumps(taxonomy))
    return root


def test_inat_json_layout_maps_category_ids_to_labels_in_id_order(tmp_path):
    categories = [{"id": 12, "name": "Quercus robur", "supercategory": "Plantae"},
                  {"id": 3, "name": "Bufo bufo", "supercategory": "Amphibia"}]
    root = write_inat_json(tmp_path / "inat", categories,
                           {"train2018": [(3, "a"), (3, "b"), (12, "c")], "val2018": [(12, "d"), (3, "e")]})
    task = load_task("inat2018", data_dir=str(root))
    assert task.label_names == ["Bufo bufo", "Quercus robur"]  # sorted by category id
    assert (len(task.train), len(task.eval)) == (3, 2)
    for image, label in all_samples(task.train) + all_samples(task.eval):
        assert image.getpixel((0, 0))[0] == (3, 12)[label] * 10


# as 2018 and 2019 ship them: the split files number their categories, categories.json names them
NUMBERED = [{"id": i, "name": str(i)} for i in (0, 1, 2)]
TAXONOMY = [{"id": 0, "name": "Quercus robur", "genus": "Quercus", "family": "Fagaceae", "kingdom": "Plantae"},
            {"id": 1, "name": "Quercus ilex", "genus": "Quercus", "family": "Fagaceae", "kingdom": "Plantae"},
            {"id": 2, "name": "Fagus sylvatica", "genus": "Fagus", "family": "Fagaceae", "kingdom": "Plantae"}]
INAT_SPLITS = {"train2018": [(0, "a"), (1, "b"), (2, "c"), (2, "d")], "val2018": [(1, "e"), (2, "f")]}


def test_inat_json_names_its_classes_from_categories_json_at_the_level_asked(tmp_path):
    root = str(write_inat_json(tmp_path / "inat", NUMBERED, INAT_SPLITS, taxonomy=TAXONOMY))
    assert load_task("inat2018", data_dir=root).label_names == ["Quercus robur", "Quercus ilex", "Fagus sylvatica"]
    genus = load_task("inat2018", data_dir=root, inat_category="genus")
    assert genus.label_names == ["Fagus", "Quercus"]
    assert [label for _, label in all_samples(genus.train)] == [1, 1, 0, 0]  # both oaks are one class
    assert load_task("inat2018", data_dir=root, inat_category="family").label_names == ["Fagaceae"]


def test_inat_json_without_categories_json_says_so_and_refuses_a_level_above_the_species(tmp_path, caplog):
    root = str(write_inat_json(tmp_path / "inat", NUMBERED, INAT_SPLITS))
    with caplog.at_level("WARNING"):
        assert load_task("inat2018", data_dir=root).label_names == ["0", "1", "2"]
    assert "no categories.json in" in caplog.text and "species names" in caplog.text
    with pytest.raises(DataError, match="--inat-category genus needs the taxonomy .*categories.json, which is not there"):
        load_task("inat2018", data_dir=root, inat_category="genus")
    with pytest.raises(DataError, match="choose one of name, genus, family"):
        load_task("inat2018", data_dir=str(write_inat_json(tmp_path / "t", NUMBERED, INAT_SPLITS, TAXONOMY)),
                  inat_category="species")
    with pytest.raises(DataError, match="--inat-category is for the iNaturalist presets with a taxonomy .*not cifar10"):
        load_task("cifar10", inat_category="genus")


def test_inat2021_folder_layout_streams_by_default_with_prefix_ordered_classes(tmp_path):
    root = tmp_path / "inat21"
    classes = ["00000_Animalia_Annelida_Clitellata_Haplotaxida_Lumbricidae_Lumbricus_terrestris",
               "00001_Plantae_Tracheophyta_Magnoliopsida_Fagales_Fagaceae_Quercus_robur"]
    for split, count in (("train", 3), ("val", 1), ("train_mini", 1)):
        for label, name in enumerate(classes):
            os.makedirs(root / split / name)
            for i in range(count):
                Image.new("L", (8, 8), 100 * label).save(root / split / name / f"{i}.jpg")
    task = load_task("inat2021", data_dir=str(root))
    assert task.streaming and task.label_names[1].endswith("Quercus_robur")
    assert sorted(label for _, label in task.train) == [0, 0, 0, 1, 1, 1]  # train_mini is not mixed in
    assert sorted(label for _, label in task.eval) == [0, 1]
    mapped = load_task("inat2021", data_dir=str(root), streaming=False, train_split="train_mini")
    assert len(mapped.train) == 2


# ---- image modes and unreadable images ----------------------------------------------------------

def test_grayscale_palette_and_cmyk_images_become_rgb_and_transparent_ones_rgba(tmp_path):
    # each file has its own width, which tells them apart after loading
    root = tmp_path / "modes"
    os.makedirs(root / "train" / "gray")
    os.makedirs(root / "train" / "color")
    Image.new("L", (6, 4), 77).save(root / "train" / "gray" / "l.png")
    Image.new("I;16", (7, 4), 0xFF00).save(root / "train" / "gray" / "i16.png")
    palette = Image.new("P", (8, 4), 1)
    palette.putpalette([0, 0, 0, 10, 200, 10] + [0] * 762)
    palette.save(root / "train" / "color" / "p.png", transparency=0)  # entry 0 transparent, unused
    transparent = Image.new("P", (9, 4), 0)
    transparent.putpalette([0, 0, 0] * 256)
    transparent.save(root / "train" / "color" / "p_transparent.png", transparency=0)
    Image.new("CMYK", (10, 4), (0, 255, 255, 0)).save(root / "train" / "color" / "cmyk.jpg")
    task = load_task(str(root), eval_split="train")
    by_width = {}
    for image, _ in all_samples(task.train):
        assert image.mode == ("RGBA" if image.size[0] in (8, 9) else "RGB")  # the palettes with a transparent entry
        by_width[image.size[0]] = flatten(image).getpixel((0, 0))
    assert by_width[6] == (77, 77, 77)
    assert by_width[7] == (255, 255, 255)  # 16-bit scaled down, not clipped
    assert by_width[8] == (10, 200, 10)
    assert by_width[9] == (255, 255, 255)  # transparent pixels land on flatten's default, white
    assert by_width[10][0] > 200 and by_width[10][1] < 60  # CMYK red stays red


def test_to_rgb_flattens_alpha_onto_white_by_default_or_the_colour_given():
    half = Image.new("RGBA", (2, 2), (0, 0, 0, 0))
    assert to_rgb(half).getpixel((0, 0)) == (255, 255, 255)
    assert to_rgb(half, (0, 0, 0)).getpixel((0, 0)) == (0, 0, 0)
    assert to_rgb(Image.new("LA", (2, 2), (0, 255))).getpixel((0, 0)) == (0, 0, 0)


def _alpha_digit(size=8):
    """A white square at half opacity in the middle of a transparent image."""
    image = Image.new("RGBA", (size, size), (255, 255, 255, 0))
    image.paste((255, 255, 255, 128), (2, 2, 6, 6))
    return image


@pytest.mark.parametrize("background, corner", [(None, (255, 255, 255)), ((0, 0, 0), (0, 0, 0)), ((10, 20, 30), (10, 20, 30))])
def test_the_transform_flattens_transparency_onto_the_data_configs_background(background, corner):
    data_config = {"input_size": (3, 8, 8), "interpolation": "nearest", "mean": (0.0,) * 3, "std": (1.0,) * 3,
                   "crop_pct": 1.0, **({"background": background} if background else {})}
    tensor = build_transforms(data_config, train=False)(_alpha_digit())
    assert tuple(round(float(v) * 255) for v in tensor[:, 0, 0]) == corner  # no background key: white, as before
    centre = tuple(round(float(v) * 255) for v in tensor[:, 4, 4])
    assert all(abs(c - (255 * 128 + k * 127) / 255) <= 1 for c, k in zip(centre, corner))


def test_the_bases_background_black_for_the_bundled_models_the_mean_for_others_and_the_flag_wins():
    import timm

    from attnft import bundled  # noqa: F401
    from attnft.models import data_config

    bundled_model = timm.create_model("vit_fmnist_patch4_28")
    assert data_config(bundled_model)["background"] == (0, 0, 0)  # pretrained on black
    other = timm.create_model("deit_tiny_patch16_224", img_size=32, depth=1)
    assert data_config(other)["background"] == (124, 116, 104)  # ImageNet's mean: an all-zero input
    assert data_config(bundled_model, background="white")["background"] == (255, 255, 255)
    assert data_config(bundled_model, background="mean")["background"] == (73, 73, 73)
    assert data_config(other, background="1,2,3")["background"] == (1, 2, 3)


@pytest.mark.parametrize("spec", ["grey", "1,2", "1,2,256", "-1,0,0", ""])
def test_a_bad_background_is_a_config_error(spec):
    from attnft.training.config import FinetuneConfig

    with pytest.raises(ConfigError, match="background"):
        FinetuneConfig(background=spec)


def test_corrupt_image_is_skipped_with_its_path_in_one_warning(tmp_path, caplog):
    root = write_image_folder(tmp_path / "f", per_class=3)
    corrupt = root / "train" / "dog" / "broken.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    truncated = root / "train" / "cat" / "truncated.png"
    truncated.write_bytes((root / "train" / "cat" / "0.png").read_bytes()[:40])
    task = load_task(str(root))
    data_config = {"input_size": (3, 16, 16), "interpolation": "bilinear", "mean": (0.5,) * 3,
                   "std": (0.5,) * 3, "crop_pct": 1.0}
    train = with_transform(task.train, build_transforms(data_config, train=False))
    loader = DataLoader(train, batch_size=4, collate_fn=collate_skipping_failures)
    with caplog.at_level(logging.WARNING, logger="attnft.data.images"):
        for _ in range(2):  # a second epoch does not warn again
            seen = sum(len(labels) for _, labels in (batch for batch in loader if batch is not None))
            assert seen == 6
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2
    assert any(str(corrupt) in message for message in warnings)
    assert any(str(truncated) in message for message in warnings)


def test_unreadable_embedded_image_is_reported_by_its_index(tmp_path, caplog):
    data = image_dataset(3, ["a", "b"])
    broken = Dataset.from_dict({"image": [{"bytes": b"garbage", "path": None}], "label": [1]}, features=data.features)
    DatasetDict(train=datasets.concatenate_datasets([data, broken]), test=data).save_to_disk(tmp_path / "d")
    task = load_task(str(tmp_path / "d"))
    with caplog.at_level(logging.WARNING, logger="attnft.data.images"):
        assert task.train[3] is None and task.train[2] is not None
    assert "sample 3 of saved dataset" in caplog.records[0].getMessage()


def test_a_batch_of_only_unreadable_images_collates_to_none():
    assert collate_skipping_failures([None, None]) is None


# ---- errors -------------------------------------------------------------------------------------

def test_unknown_dataset_or_preset_lists_the_presets():
    with pytest.raises(DataError, match="presets: cars, flowers102") as error:
        load_task("stanford-carz")
    assert "\n" not in str(error.value)


def test_missing_label_column_lists_the_columns(tmp_path):
    data = image_dataset(4, ["a", "b"], extra={"caption": (["x"] * 4, Value("string"))}).remove_columns("label")
    DatasetDict(train=data, test=data).save_to_disk(tmp_path / "d")
    with pytest.raises(DataError, match="columns: image, caption"):
        load_task(str(tmp_path / "d"))
    with pytest.raises(DataError, match=r"label column 'species' not found .*columns: image, caption"):
        load_task(str(tmp_path / "d"), label_key="species")


def test_missing_image_column_lists_the_columns(tmp_path):
    data = image_dataset(4, ["a", "b"]).remove_columns("image").add_column("text", ["t"] * 4)
    DatasetDict(train=data, test=data).save_to_disk(tmp_path / "d")
    with pytest.raises(DataError, match="image.*columns: label, text"):
        load_task(str(tmp_path / "d"))


def test_two_class_label_columns_without_a_label_column_ask_for_label_key(tmp_path):
    data = image_dataset(4, ["a", "b"], extra={"coarse": ([0, 1, 0, 1], ClassLabel(names=["p", "q"]))})
    data = data.rename_column("label", "fine")
    DatasetDict(train=data, test=data).save_to_disk(tmp_path / "d")
    with pytest.raises(DataError, match="--label-key"):
        load_task(str(tmp_path / "d"))
    assert load_task(str(tmp_path / "d"), label_key="coarse").label_names == ["p", "q"]


def test_folder_with_no_images_is_an_error(tmp_path):
    os.makedirs(tmp_path / "empty" / "train" / "cat")
    (tmp_path / "empty" / "train" / "cat" / "notes.txt").write_text("no pictures here")
    with pytest.raises(DataError, match="no images in"):
        load_task(str(tmp_path / "empty"))


def test_images_without_class_folders_is_an_error(tmp_path):
    for split in ("train", "val"):
        os.makedirs(tmp_path / "flat" / split)
        Image.new("RGB", (4, 4)).save(tmp_path / "flat" / split / "a.png")
    with pytest.raises(DataError, match="no class folders"):
        load_task(str(tmp_path / "flat"))


def test_missing_split_lists_the_splits(tmp_path):
    root = write_image_folder(tmp_path / "f", per_class=1)
    with pytest.raises(DataError, match="split 'test' not found .*splits: train, validation"):
        load_task(str(root), eval_split="test")



def test_a_class_with_one_image_cannot_be_held_out(tmp_path):
    saved = tmp_path / "saved"
    DatasetDict(train=image_dataset(2, ["a", "b"])).save_to_disk(saved)
    with pytest.raises(DataError, match="class 'a' .* has 1 image.*pass --eval-split"):
        load_task(str(saved))


def test_a_hold_out_smaller_than_the_classes_is_an_error(tmp_path):
    root = write_image_folder(tmp_path / "flat", splits=("",), classes=("cat", "dog", "owl"), per_class=2)
    with pytest.raises(DataError, match="gives 1 of 6 images, fewer than its 3 classes .*--val-fraction"):
        load_task(str(root))
    assert len(load_task(str(root), val_fraction=0.5).eval) == 3


def image_names(split) -> list[str]:
    return [row["image"]["path"] for row in split.rows]


@pytest.mark.parametrize("fraction", [0.1, 0.25])
def test_a_folder_of_class_folders_holds_out_a_stratified_disjoint_eval_split(tmp_path, fraction):
    root = write_image_folder(tmp_path / "flat", splits=("",), classes=("cat", "dog", "owl"), per_class=20)
    task = load_task(str(root), val_fraction=fraction)
    train, held = image_names(task.train), image_names(task.eval)
    assert task.label_names == ["cat", "dog", "owl"]
    assert not set(train) & set(held) and len(train) + len(held) == 60  # every image in exactly one split
    labels = [label for _, label in all_samples(task.eval)]
    assert len(labels) == round(60 * fraction) and sorted(set(labels)) == [0, 1, 2]
    assert max(labels.count(c) for c in range(3)) - min(labels.count(c) for c in range(3)) <= 1  # stratified
    assert "held out" in task.held_out
    again = load_task(str(root), val_fraction=fraction)  # seeded: attnft eval scores the same images
    assert image_names(again.eval) == held


def test_hub_dataset_while_offline_fails_fast_and_says_what_to_pass():
    start = time.monotonic()
    for name in ("cars", "someone/some-dataset"):
        with pytest.raises(DataError, match="--data-dir") as error:
            load_task(name)
        assert "offline" in str(error.value).lower() or "hub is off" in str(error.value)
    assert time.monotonic() - start < 5


def test_the_download_hint_fetches_only_the_files_of_the_splits_the_preset_reads(tmp_path):
    """Cars' repo also holds corrupted copies of its test set (~6 GB in all): the hint includes the card and
    the train and test files only, and huggingface_hub's own CLI accepts it (offline it stops at the hub)."""
    from huggingface_hub.utils import filter_repo_objects

    with pytest.raises(DataError) as error:
        load_task("cars")
    command = re.search(r"\((hf download .*?)\)", str(error.value)).group(1)
    patterns = shlex.split(command)[shlex.split(command).index("--include"):]
    include = [patterns[i + 1] for i, word in enumerate(patterns) if word == "--include"]
    listing = ["README.md", ".gitattributes"] + [f"data/{split}-0000{i}-of-00002.parquet"
                                                 for split in ("train", "test", "contrast", "pixelate") for i in (0, 1)]
    assert sorted(filter_repo_objects(listing, allow_patterns=include)) == [
        "README.md", "data/test-00000-of-00002.parquet", "data/test-00001-of-00002.parquet",
        "data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
    hf = shutil.which("hf", path=os.path.dirname(sys.executable)) or shutil.which("hf")
    argv = [hf] + shlex.split(command.replace("DIR", str(tmp_path / "cars")))[1:] + ["--dry-run"]
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=60)
    assert done.returncode == 1 and "DryRunError" in done.stderr, done.stderr[-500:]  # parsed; no usage error (2)
    assert not (tmp_path / "cars").exists()


def test_the_flowers_preset_reads_the_pinned_commit_and_its_hint_fetches_that_commit(tmp_path):
    """A later push to the repo cannot change the benchmark: the preset names a commit, and the copy the hint makes
    is of that commit (huggingface_hub's CLI parses the command; offline it stops at the hub)."""
    preset = get_preset("flowers102")
    assert re.fullmatch(r"[0-9a-f]{40}", preset.revision)
    with pytest.raises(DataError) as error:
        load_task("flowers102")
    command = re.search(r"\((hf download .*?)\)", str(error.value)).group(1)
    words = shlex.split(command)
    assert words[words.index("--revision") + 1] == preset.revision
    hf = shutil.which("hf", path=os.path.dirname(sys.executable)) or shutil.which("hf")
    argv = [hf] + shlex.split(command.replace("DIR", str(tmp_path / "flowers")))[1:] + ["--dry-run"]
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=60)
    assert done.returncode == 1 and "DryRunError" in done.stderr, done.stderr[-500:]


def test_the_flowers_preset_asks_datasets_for_the_pinned_commit(monkeypatch):
    """No hub here: a stand-in for datasets' builder records what attnft asks for, then fails as offline does."""
    asked = {}

    def builder(path, **kwargs):
        asked.update(kwargs, path=path)
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset_builder", builder)
    with pytest.raises(DataError, match="--revision 7e43fe37"):
        load_task("flowers102")
    assert asked["path"] == "Donghyun99/Oxford-Flower-102" and asked["revision"] == get_preset("flowers102").revision


def test_a_copy_of_a_preset_whose_split_is_not_the_standard_one_is_refused_by_name(tmp_path):
    pushed = tmp_path / "pushed"  # one test image fewer: a later push, a partial download
    DatasetDict(pixel_splits(dict(FLOWERS_SPLITS, test=6148), ["rose", "tulip"])).save_to_disk(pushed)
    with pytest.raises(DataError, match="split 'test' of .* has 6,148 images, Oxford Flowers-102's standard split "
                                        "has 6,149: this is not the benchmark copy"):
        load_task("flowers102", data_dir=str(pushed))
    assert len(load_task(str(pushed), eval_split="test").eval) == 6148  # as a plain directory: read as it is


def test_inat_preset_without_data_dir_asks_for_it():
    with pytest.raises(DataError, match="--data-dir"):
        load_task("inat2019")


def test_batch_size_larger_than_the_dataset_is_an_error(tmp_path):
    task = load_task(str(write_image_folder(tmp_path / "f", per_class=2)))
    check_batch_size(task.train, 4)
    with pytest.raises(DataError, match="batch size 5 is larger than the dataset \\(4 samples\\)"):
        check_batch_size(task.train, 5)


# ---- transforms and mixup -----------------------------------------------------------------------

@pytest.mark.parametrize("train", [True, False])
def test_transforms_give_normalised_tensors_at_the_configured_resolution(train):
    data_config = {"input_size": (3, 48, 40), "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406),
                   "std": (0.229, 0.224, 0.225), "crop_pct": 0.875}
    aug = AugConfig(auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25, color_jitter=0.4)
    transform = build_transforms(data_config, train=train, aug=aug)
    for size in ((28, 28), (300, 200)):
        tensor = transform(Image.new("RGB", size, (120, 60, 30)))
        assert tensor.shape == (3, 48, 40) and tensor.dtype == torch.float32


def test_transformed_split_feeds_a_dataloader(tmp_path):
    task = load_task(str(write_image_folder(tmp_path / "f", per_class=2)))
    data_config = {"input_size": (3, 32, 32), "interpolation": "bilinear", "mean": (0.5,) * 3,
                   "std": (0.5,) * 3, "crop_pct": 0.9}
    train = with_transform(task.train, build_transforms(data_config, train=True))
    images, labels = next(iter(DataLoader(train, batch_size=4, collate_fn=collate_skipping_failures)))
    assert images.shape == (4, 3, 32, 32) and labels.tolist() == sorted(labels.tolist())


def test_mixup_is_off_by_default_and_mixes_odd_batches_when_on():
    assert make_mixup(AugConfig(), num_classes=5) is None
    mixup = make_mixup(AugConfig(mixup=0.8, cutmix=1.0, smoothing=0.1), num_classes=5)
    images, targets = mixup(torch.rand(5, 3, 8, 8), torch.tensor([0, 1, 2, 3, 4]))
    assert images.shape == (5, 3, 8, 8) and targets.shape == (5, 5)
    assert torch.allclose(targets.sum(dim=1), torch.ones(5))
    assert targets[-1].argmax() == 4 and targets[-1].max() == pytest.approx(0.9 + 0.1 / 5)


def test_randaugment_posterize_to_zero_bits_does_not_crash():
    """DeiT's rand-m9-mstd0.5-inc1 can posterize to 0 bits, which Pillow 13 refuses."""
    from PIL import Image
    from timm.data.auto_augment import AugmentOp

    import attnft.data.transforms  # noqa: F401  installs the fix

    op = AugmentOp("PosterizeIncreasing", prob=1.0, magnitude=10)  # level 10 -> 0 bits kept
    out = op(Image.new("RGB", (8, 8), (200, 100, 50)))
    assert out.getpixel((0, 0)) == (0, 0, 0)
