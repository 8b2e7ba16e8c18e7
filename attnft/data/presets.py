"""Named downstream datasets: where each one lives and which columns and splits to use.

Plain data; :func:`attnft.data.loading.load_task` reads it. Hub ids and columns were
checked against the datasets' cards (the hub is not reachable from the test machines,
so tests only check that a preset resolves to these values); Flowers-102's ``revision`` is the commit a
public benchmark pinned and counted, not read here, and ``split_sizes`` catch any other copy. Any hub preset also
loads from a local copy given as ``data_dir`` (an ``hf download`` of the
repo, or a ``save_to_disk`` directory) with the same columns and splits.
"""
from dataclasses import dataclass

from ..core.errors import DataError

# layouts: how the files of a preset are read
HUB = "hub"                       # a hub repo (or a local copy of it) read by `datasets`
FASHION_MNIST = "fashion-mnist"   # the four IDX .gz files, see attnft.data.fashion_mnist
INAT_JSON = "inat-json"           # <root>/<split>.json (COCO-style) + the image files it names
INAT_FOLDERS = "inat-folders"     # <root>/<split>/<NNNNN_Kingdom_..._species>/*.jpg (iNat 2021)


@dataclass(frozen=True)
class DatasetPreset:
    """One named dataset. ``train_split`` may join splits with ``+`` (concatenated)."""

    name: str
    title: str
    layout: str
    hub_id: str | None
    image_key: str
    label_key: str
    train_split: str
    eval_split: str
    num_classes: int
    label_names_from: str  # where the class names come from, for humans
    streaming: bool = False  # the default when the caller does not choose
    notes: str = ""
    revision: str | None = None  # the hub commit read (None: the repo's head)
    split_sizes: tuple[tuple[str, int], ...] = ()  # (split, images) of the standard split: checked on load

    def expected_size(self, split: str) -> int | None:
        """The images of ``split`` (parts joined with ``+``) in the standard split; None when not known."""
        sizes = dict(self.split_sizes)
        parts = split.split("+")
        return sum(sizes[part] for part in parts) if all(part in sizes for part in parts) else None


PRESETS: dict[str, DatasetPreset] = {
    preset.name: preset
    for preset in (
        DatasetPreset(
            name="cars", title="Stanford Cars", layout=HUB, hub_id="tanganke/stanford_cars",
            image_key="image", label_key="label", train_split="train", eval_split="test", num_classes=196,
            label_names_from="ClassLabel of the hub dataset",
            notes="8,144 / 8,041 images; the repo's corrupted test copies (contrast, pixelate, ...) are not fetched",
            split_sizes=(("train", 8144), ("test", 8041)),
        ),
        DatasetPreset(
            name="flowers102", title="Oxford Flowers-102", layout=HUB, hub_id="Donghyun99/Oxford-Flower-102",
            image_key="image", label_key="label", train_split="train+validation", eval_split="test", num_classes=102,
            label_names_from="ClassLabel of the hub dataset",
            notes="the official setid split 1,020 / 1,020 / 6,149; train+val (2,040) for training, as in the paper",
            # the commit a public benchmark pinned and counted 8,189 images at; the sizes below are checked on load
            revision="7e43fe37eeb9278138ab0bd2d0abb10d0f703d09",
            split_sizes=(("train", 1020), ("validation", 1020), ("test", 6149)),
        ),
        DatasetPreset(
            name="inat2018", title="iNaturalist 2018", layout=INAT_JSON, hub_id=None,
            image_key="image", label_key="label", train_split="train2018", eval_split="val2018", num_classes=8142,
            label_names_from="categories.json beside train2018.json (--inat-category: name, genus, family, ...), "
                             "else the category ids",
            notes="data_dir holds train2018.json, val2018.json, categories.json and train_val2018/; 437,513 / 24,426 images",
        ),
        DatasetPreset(
            name="inat2019", title="iNaturalist 2019", layout=INAT_JSON, hub_id=None,
            image_key="image", label_key="label", train_split="train2019", eval_split="val2019", num_classes=1010,
            label_names_from="categories.json beside train2019.json (--inat-category: name, genus, family, ...), "
                             "else the category ids",
            notes="data_dir holds train2019.json, val2019.json, categories.json and train_val2019/; about 265k / 3k images",
        ),
        DatasetPreset(
            name="inat2021", title="iNaturalist 2021", layout=INAT_FOLDERS, hub_id=None,
            image_key="image", label_key="label", train_split="train", eval_split="val", num_classes=10000,
            label_names_from="class folder names (NNNNN_Kingdom_..._species)", streaming=True,
            notes="data_dir holds train/ (2.7M images, streamed by default), val/ and optionally train_mini/",
        ),
        DatasetPreset(
            name="cifar10", title="CIFAR-10", layout=HUB, hub_id="uoft-cs/cifar10",
            image_key="img", label_key="label", train_split="train", eval_split="test", num_classes=10,
            label_names_from="ClassLabel of the hub dataset", notes="50,000 / 10,000 images of 32x32",
        ),
        DatasetPreset(
            name="cifar100", title="CIFAR-100", layout=HUB, hub_id="uoft-cs/cifar100",
            image_key="img", label_key="fine_label", train_split="train", eval_split="test", num_classes=100,
            label_names_from="ClassLabel of the hub dataset",
            notes="50,000 / 10,000 images of 32x32; fine labels (coarse_label holds the 20 superclasses)",
        ),
        DatasetPreset(
            name="pets", title="Oxford-IIIT Pets", layout=HUB, hub_id="timm/oxford-iiit-pet",
            image_key="image", label_key="label", train_split="train", eval_split="test", num_classes=37,
            label_names_from="ClassLabel of the hub dataset",
            notes="3,680 / 3,669 images; 37 breeds (label_cat_dog holds cat vs dog)",
        ),
        DatasetPreset(
            name="food101", title="Food-101", layout=HUB, hub_id="ethz/food101",
            image_key="image", label_key="label", train_split="train", eval_split="validation", num_classes=101,
            label_names_from="ClassLabel of the hub dataset", notes="75,750 / 25,250 images",
        ),
        DatasetPreset(
            name="fashion-mnist", title="Fashion-MNIST", layout=FASHION_MNIST, hub_id=None,
            image_key="image", label_key="label", train_split="train", eval_split="test", num_classes=10,
            label_names_from="attnft.data.fashion_mnist.LABEL_NAMES",
            notes="the Debian dataset-fashion-mnist files (60,000 / 10,000), else attnft's bundled sample; "
            "data_dir: a folder with the four official .gz files (the hub copy is zalando-datasets/fashion_mnist)",
        ),
    )
}


def takes_inat_category(dataset: str | None) -> bool:
    """Whether ``dataset`` can be classified at a taxonomic level (``--inat-category``): the json-layout
    iNaturalist presets, whose ``categories.json`` gives the levels."""
    preset = PRESETS.get(dataset) if dataset is not None else None
    return preset is not None and preset.layout == INAT_JSON


def get_preset(name: str) -> DatasetPreset:
    """The preset called ``name``; a :class:`DataError` listing the presets if there is none."""
    try:
        return PRESETS[name]
    except KeyError:
        raise DataError(f"unknown dataset preset {name!r}; presets: {', '.join(PRESETS)}") from None
