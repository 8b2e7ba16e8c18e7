"""iNaturalist from a local copy in the official layouts, as Hugging Face datasets.

2017-2019 (and 2021's own json files): ``<root>/<split>.json`` in the COCO style,
``images`` (id, file_name relative to root), ``annotations`` (image_id, category_id)
and ``categories`` (id, name); the images sit where ``file_name`` says
(``train_val2018/Plantae/7477/<hash>.jpg``). 2018 and 2019 name their categories by number: the
species names and the levels above them (genus, family, ...) are in ``categories.json``, a separate
download, read when it is there (:func:`inat_json_classes`).

2021: ``<root>/<split>/<NNNNN_Kingdom_Phylum_Class_Order_Family_Genus_species>/*.jpg``
for the splits ``train`` (2.7M images), ``train_mini`` and ``val``; the class index is
the folder's rank, which is also its 5-digit prefix.

Both give rows ``{"image": {"path", "bytes"}, "label": int}`` with the image column
undecoded (decoding happens in :mod:`attnft.data.images`). Nothing is read from the
images here, so a missing or corrupt file is reported when it is first used.
"""
import json
import logging
import os
from dataclasses import dataclass

import pyarrow as pa
from datasets import ClassLabel, Dataset, Features, Image, IterableDataset
from datasets.packaged_modules.imagefolder.imagefolder import IMAGE_EXTENSIONS

from ..core.errors import DataError
from ..core.parsing import short
from .folders import image_path_dataset

logger = logging.getLogger(__name__)
_EXTENSIONS = frozenset(IMAGE_EXTENSIONS)
# the 2018 / 2019 taxonomy, a download of its own beside the split files: [{id, name, genus, family, ...}]
CATEGORIES_FILE = "categories.json"
# the levels a json-layout copy can be classified at (DeiT's `--inat-category`), the species first
INAT_LEVELS = ("name", "genus", "family", "order", "class", "phylum", "kingdom", "supercategory")


def _features(label_names: list[str]) -> Features:
    return Features({"image": Image(decode=False), "label": ClassLabel(names=label_names)})


def _json_splits(root: str) -> list[str]:
    return sorted(name[: -len(".json")] for name in os.listdir(root) if name.endswith(".json"))


def _folders(root: str) -> list[str]:
    return sorted(entry.name for entry in os.scandir(root) if entry.is_dir())


# ---- json layout (2017-2019) ------------------------------------------------------------------

def _read_json(root: str, split: str) -> dict:
    path = os.path.join(root, f"{split}.json")
    if not os.path.isfile(path):
        raise DataError(f"iNaturalist split {split!r} not found: no {path}; json splits here: {_json_splits(root)}")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as error:
        raise DataError(f"cannot read iNaturalist annotations {path}: {error}") from None
    missing = [key for key in ("images", "annotations", "categories") if key not in meta]
    if missing:
        raise DataError(f"{path} is not an iNaturalist annotation file: no {', '.join(missing)} "
                        f"(keys: {', '.join(meta)})")
    return meta


@dataclass(frozen=True)
class InatClasses:
    """The classes of a json-layout copy at one taxonomic level: each category's label, and the labels' names."""

    label_of: dict[int, int]  # category id -> label
    label_names: list[str]


def _read_taxonomy(root: str) -> dict[int, dict] | None:
    """``<root>/categories.json`` by category id, or None when it is not there."""
    path = os.path.join(root, CATEGORIES_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            entries = json.load(f)
        return {int(entry["id"]): entry for entry in entries}
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise DataError(f"cannot read the iNaturalist taxonomy {path}: {short(error)} (a list of "
                        f"{{id, name, genus, family, ...}})") from None


def check_inat_category(level: str) -> None:
    """DataError unless ``level`` is one of :data:`INAT_LEVELS` (before any model or data is read)."""
    if level not in INAT_LEVELS:
        raise DataError(f"--inat-category {short(level)}: choose one of {', '.join(INAT_LEVELS)}")


def inat_json_classes(root: str, split: str, level: str = "name") -> InatClasses:
    """The categories of ``<root>/<split>.json`` as classes at ``level`` (:data:`INAT_LEVELS`).

    At ``name`` (the species) each category is a class, in the order of their ids; at a level above, each
    of its values (a genus, a family, ...) is one, in sorted order: the classes DeiT's iNaturalist loader
    counts, numbered by name rather than by first appearance in the annotations as there. The names come from ``categories.json``, downloaded beside the split files; without it the
    split's own category names (ids, for 2018 and 2019) stand, and only ``name`` can be chosen.
    """
    check_inat_category(level)
    categories = sorted(_read_json(root, split)["categories"], key=lambda category: category["id"])
    ids = [category["id"] for category in categories]
    taxonomy = _read_taxonomy(root)
    if taxonomy is None:
        if level != "name":
            raise DataError(f"--inat-category {level} needs the taxonomy {os.path.join(root, CATEGORIES_FILE)}, "
                            f"which is not there (download categories.json beside {split}.json)")
        logger.warning("no %s in %s: the classes are named as %s.json names its categories (ids for 2018 and 2019); "
                       "download categories.json beside it for species names", CATEGORIES_FILE, root, split)
        return InatClasses({i: label for label, i in enumerate(ids)}, [str(c.get("name") or c["id"]) for c in categories])
    unknown = [i for i in ids if i not in taxonomy or level not in taxonomy[i]]
    if unknown:
        raise DataError(f"{os.path.join(root, CATEGORIES_FILE)} gives no {level!r} for category {unknown[0]} of "
                        f"{split}.json ({len(unknown)} such)")
    if level == "name":
        return InatClasses({i: label for label, i in enumerate(ids)}, [str(taxonomy[i]["name"]) for i in ids])
    values = sorted({str(taxonomy[i][level]) for i in ids})
    label_of_value = {value: label for label, value in enumerate(values)}
    return InatClasses({i: label_of_value[str(taxonomy[i][level])] for i in ids}, values)


def inat_json_split(root: str, split: str, classes: InatClasses, streaming: bool = False) -> Dataset | IterableDataset:
    """The annotated images of ``<root>/<split>.json``, labelled as ``classes`` labels their categories."""
    meta = _read_json(root, split)
    file_of = {image["id"]: image["file_name"] for image in meta["images"]}
    label_of, label_names = classes.label_of, classes.label_names
    paths, labels = [], []
    for annotation in meta["annotations"]:
        category = annotation["category_id"]
        if category not in label_of:
            raise DataError(f"{split}.json labels an image with category {category}, "
                            f"which the training split's categories do not have")
        paths.append(os.path.join(root, file_of[annotation["image_id"]]))
        labels.append(label_of[category])
    if not paths:
        raise DataError(f"{os.path.join(root, split + '.json')} has no annotated images")
    return image_path_dataset(pa.table({"path": paths, "label": labels}), label_names, streaming)


# ---- folder layout (2021) ---------------------------------------------------------------------

def inat_folder_classes(root: str, split: str) -> list[str]:
    """The class folders of ``<root>/<split>``, sorted (their 5-digit prefixes make this the id order)."""
    directory = os.path.join(root, split)
    if not os.path.isdir(directory):
        raise DataError(f"iNaturalist split {split!r} not found: no folder {directory}; "
                        f"folders here: {_folders(root)}")
    classes = _folders(directory)
    if not classes:
        raise DataError(f"{directory} has no class folders (expected NNNNN_Kingdom_..._species/ folders of images)")
    return classes


def inat_folder_label_names(classes: list[str]) -> list[str]:
    """``00000_Animalia_..._Lumbricus_terrestris`` -> ``Animalia_..._Lumbricus_terrestris``."""
    return [name.split("_", 1)[1] if name[:5].isdigit() and "_" in name else name for name in classes]


def _images_of_folders(folders: list[tuple[int, str]]):
    """Rows for every image file of each (label, folder); one folder is one shard when streaming."""
    for label, folder in folders:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.is_file() and os.path.splitext(entry.name)[1].lower() in _EXTENSIONS:
                yield {"image": {"path": entry.path, "bytes": None}, "label": label}


def inat_folder_split(root: str, split: str, classes: list[str], streaming: bool) -> Dataset | IterableDataset:
    """The images of ``<root>/<split>``, labelled by position in ``classes`` (the training split's folders)."""
    found = inat_folder_classes(root, split)
    label_of = {name: label for label, name in enumerate(classes)}
    unknown = [name for name in found if name not in label_of]
    if unknown:
        raise DataError(f"{os.path.join(root, split)} has class folders the training split lacks: {unknown[:5]}")
    folders = [(label_of[name], os.path.join(root, split, name)) for name in found]
    features = _features(inat_folder_label_names(classes))
    if streaming:
        # a list in gen_kwargs is what `datasets` shards across DataLoader workers and shuffles
        return IterableDataset.from_generator(_images_of_folders, features=features, gen_kwargs={"folders": folders})
    rows = list(_images_of_folders(folders))
    if not rows:
        raise DataError(f"no images under {os.path.join(root, split)}")
    paths, labels = [row["image"]["path"] for row in rows], [row["label"] for row in rows]
    return image_path_dataset(pa.table({"path": paths, "label": labels}), features["label"].names)
