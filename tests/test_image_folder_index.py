"""An image folder's index: the same images, labels, class names and held-out split as datasets' imagefolder gave
before attnft read folders itself; cached by the folder's listing, never stale, never written into the folder."""
import hashlib
import os

import datasets
import huggingface_hub
import pytest
from PIL import Image

from attnft.data import load_task


@pytest.fixture(autouse=True)
def isolated_offline_datasets(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


CLASSES = ("Zebra", "ant", "bee cat")  # Python's order: upper case first, a space in a name


def write_folder(root, splits=("train", "val"), per_class=40):
    """root/<split>/<class>/ tiny PNGs under mixed names and cases, and files that are not images."""
    for split in splits:
        count = per_class if split in ("train", "") else per_class // 4
        for c, name in enumerate(CLASSES):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                file = (f"IMG_{i}.PNG", f"img {i}.png", f"{i:03d}.jpeg")[i % 3]
                Image.new("RGB", (4, 4), (c * 60, i, 0)).save(os.path.join(folder, file),
                                                              format="JPEG" if file.endswith("jpeg") else "PNG")
            open(os.path.join(folder, "notes.txt"), "w").write("not an image")
            Image.new("RGB", (4, 4)).save(os.path.join(folder, ".hidden.png"))
    return str(root)


def rows(split) -> list[tuple[str, int]]:
    """(path relative to the folder, label) of every sample, in the split's order."""
    indices = split.indices if split.indices is not None else range(len(split.rows))
    found = []
    for i in indices:
        row = split.rows[int(i)]
        found.append((row["image"]["path"], int(row["label"])))
    return found


def relative(pairs, root) -> list[tuple[str, int]]:
    return [(os.path.relpath(path, root), label) for path, label in pairs]


def digest(pairs) -> str:
    return hashlib.sha256("\n".join(f"{path}\t{label}" for path, label in pairs).encode()).hexdigest()[:16]


def test_a_folder_with_train_and_val_is_indexed_as_before(tmp_path):
    root = write_folder(tmp_path / "pets")
    task = load_task(root)
    train, held = relative(rows(task.train), root), relative(rows(task.eval), root)
    assert task.label_names == list(CLASSES)
    assert (len(train), len(held)) == (120, 30)
    # datasets' order: each split's files sorted as strings ("0" < "I" < "i"), upper-case classes first
    assert train[:4] == [("train/Zebra/002.jpeg", 0), ("train/Zebra/005.jpeg", 0), ("train/Zebra/008.jpeg", 0),
                         ("train/Zebra/011.jpeg", 0)]
    assert (digest(train), digest(held)) == ("e1545929eb2b44d4", "80aa90f096543b83")


def test_a_folder_of_class_folders_holds_out_the_same_images_as_before(tmp_path):
    root = write_folder(tmp_path / "flat", splits=("",))
    task = load_task(root)
    train, held = relative(rows(task.train), root), relative(rows(task.eval), root)
    assert task.label_names == list(CLASSES)
    assert held == [("ant/002.jpeg", 1), ("Zebra/img 19.png", 0), ("ant/img 37.png", 1), ("Zebra/IMG_15.PNG", 0),
                    ("ant/IMG_30.PNG", 1), ("bee cat/img 1.png", 2), ("ant/IMG_39.PNG", 1), ("Zebra/img 25.png", 0),
                    ("bee cat/IMG_9.PNG", 2), ("Zebra/img 13.png", 0), ("bee cat/img 22.png", 2),
                    ("bee cat/IMG_6.PNG", 2)]
    assert digest(train) == "f5ad256992095e09" and len(train) == 108
    subset = load_task(root, max_train=5, max_eval=3)
    assert relative(rows(subset.train), root) == [("ant/038.jpeg", 1), ("ant/005.jpeg", 1), ("Zebra/IMG_3.PNG", 0),
                                                  ("ant/img 25.png", 1), ("Zebra/005.jpeg", 0)]
    assert relative(rows(subset.eval), root) == [("ant/img 37.png", 1), ("Zebra/img 25.png", 0),
                                                 ("Zebra/img 13.png", 0)]
