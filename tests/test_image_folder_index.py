"""An image folder's index: the same images, labels, class names and held-out split as datasets' imagefolder gave
before attnft read folders itself; cached by the folder's listing, never stale, never written into the folder."""
import hashlib
import logging
import os

import datasets
import huggingface_hub
import pytest
from PIL import Image

from attnft.data import folder_cache, load_task


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


def all_samples(split):
    return [split[i] for i in range(len(split))]


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


# ---- the same as datasets' imagefolder, on the layouts it reads -----------------------------------

def png(path, color=(0, 0, 0)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (2, 2), color).save(path, format="PNG")


LAYOUTS = {
    "split folders named otherwise": ["training/a/1.png", "training/b/2.png", "dev/a/3.png", "dev/b/4.png",
                                      "testing/a/5.png", "testing/b/6.png"],
    "splits nested under a folder": ["data/train/a/1.png", "data/train/b/2.PNG", "data/val/a/3.png",
                                     "data/val/b/4.png", "data/val/b/notes.txt", "data/README.md"],
    "split in the file names": ["a/train_1.png", "a/train_2.png", "b/train-1.png", "a/test 1.png", "b/test.3.png"],
    "a class named like a split": ["train/test_tube/1.png", "train/bird/2.png", "val/test_tube/3.png",
                                   "val/bird/4.png", "train/bird/x.png.bak"],
    "class folders, a symlink among them": ["a/1.png", "a/2.jpg", "b/3.png", "b/4.png", "b/.5.png"],
    "hidden and special folders": ["train/a/1.png", "train/b/2.png", "train/.cache/a/3.png",
                                   "train/__pycache__/4.png", "val/a/.5.png", "val/a/6.png", "val/b/7.png"],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_folder_is_read_as_datasets_imagefolder_reads_it(tmp_path, layout):
    from attnft.data import sources

    for i, path in enumerate(LAYOUTS[layout]):
        png(os.path.join(tmp_path, "d", path), (i, 0, 0))
    first = os.path.join(tmp_path, "d", LAYOUTS[layout][0])
    os.symlink(first, os.path.join(os.path.dirname(first), "linked.png"))  # read like a file
    root = str(tmp_path / "d")

    def read(load):
        loaded = load(root, None, "+".join(splits[1:]) or None, False)
        undecoded = [split.cast_column("image", datasets.Image(decode=False))
                     for split in (loaded.train, loaded.eval) if split is not None]
        rows = [[(row["image"]["path"], row["label"]) for row in split] for split in undecoded]
        return loaded.train_split, loaded.eval_split, loaded.train.features["label"].names, rows

    splits = list(sources.folders.split_files(sources.folders.list_folder(root)))
    assert read(sources._load_image_folder) == read(sources._load_image_folder_with_datasets)


def test_a_folder_with_a_metadata_file_is_left_to_datasets_and_keeps_its_labels(tmp_path):
    from attnft.data import sources

    for split in ("train", "test"):
        lines = ["file_name,label"]
        for i in range(4):
            png(os.path.join(tmp_path, "m", split, f"{i}.png"), (i * 50, 0, 0))
            lines.append(f"{i}.png,{('dog', 'cat')[i % 2]}")
        (tmp_path / "m" / split / "metadata.csv").write_text("\n".join(lines) + "\n")
    loaded = sources._load_image_folder(str(tmp_path / "m"), None, None, False)
    assert loaded.data_files is not None  # read by datasets' imagefolder, which reads metadata files
    task = load_task(str(tmp_path / "m"))
    assert task.label_names == ["cat", "dog"] and [label for _, label in all_samples(task.eval)] == [1, 0, 1, 0]


# ---- the cache ----------------------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path, monkeypatch, caplog):
    """attnft's cache in tmp_path; returns a function: "cache" if the last load read the index from it, "index" if
    it indexed the folder."""
    monkeypatch.setenv(folder_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    caplog.set_level(logging.INFO, logger=folder_cache.__name__)

    def last_load():
        said = [r.getMessage() for r in caplog.records if r.name == folder_cache.__name__]
        caplog.clear()
        return "cache" if said and "read from the cache" in said[-1] else "index" if said else None
    return last_load


def test_a_second_run_reads_the_index_from_the_cache_and_gets_the_same_splits(tmp_path, cache):
    root = write_folder(tmp_path / "flat", splits=("",), per_class=8)
    first = load_task(root, max_train=10)
    entry = folder_cache.entry_path(os.path.realpath(root))
    written = os.stat(entry)
    assert cache() == "index" and not str(entry).startswith(root)
    second = load_task(root, max_train=10)
    assert cache() == "cache"
    assert (os.stat(entry).st_ino, os.stat(entry).st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert (rows(second.train), rows(second.eval), second.label_names) == (
        rows(first.train), rows(first.eval), first.label_names)


@pytest.mark.parametrize("change", ["add", "remove", "rename", "break a link"])
def test_a_changed_folder_is_indexed_again(tmp_path, cache, change):
    root = write_folder(tmp_path / "pets", per_class=8)
    before = relative(rows(load_task(root).train), root)
    assert cache() == "index"
    image = os.path.join(root, "train", "ant", "img 1.png")
    if change == "add":
        Image.new("RGB", (4, 4)).save(os.path.join(root, "train", "ant", "new.png"))
    elif change == "remove":
        os.remove(image)
    elif change == "rename":
        os.rename(image, os.path.join(root, "train", "ant", "img 1b.png"))
    else:  # the image becomes a link to a file that is gone
        os.rename(image, os.path.join(root, "moved.png"))
        os.symlink(os.path.join(root, "moved.png"), image)
        os.remove(os.path.join(root, "moved.png"))
    after = relative(rows(load_task(root).train), root)
    assert cache() == "index"
    expected = {"add": 1, "remove": -1, "rename": 0, "break a link": -1}[change]
    assert len(after) == len(before) + expected
    assert (("train/ant/new.png", 1) in after) == (change == "add")
    assert (("train/ant/img 1.png", 1) in after) == (change == "add")
    load_task(root)
    assert cache() == "cache"


def test_an_image_edited_in_place_keeps_the_index_which_holds_no_pixels(tmp_path, cache):
    root = write_folder(tmp_path / "pets", per_class=8)
    before = relative(rows(load_task(root).train), root)
    assert cache() == "index"
    image = os.path.join(root, "train", "ant", "img 1.png")
    Image.new("RGB", (6, 6), (9, 9, 9)).save(image)  # another size and mtime, the same name
    task = load_task(root)
    assert cache() == "cache" and relative(rows(task.train), root) == before
    assert next(im for im, _ in all_samples(task.train) if im.size == (6, 6)).getpixel((0, 0)) == (9, 9, 9)


def test_another_split_request_is_indexed_apart(tmp_path, cache):
    root = write_folder(tmp_path / "pets", splits=("train", "val", "test"), per_class=8)
    assert load_task(root).eval.source.endswith("[validation]") and cache() == "index"
    assert load_task(root, eval_split="test").eval.source.endswith("[test]") and cache() == "index"


def test_a_read_only_folder_is_indexed_and_nothing_is_written_into_it(tmp_path, cache):
    root = write_folder(tmp_path / "pets", per_class=8)

    def snapshot():
        return sorted((path, os.lstat(os.path.join(path, name)).st_mtime_ns)
                      for path, folders, files in os.walk(root) for name in folders + files)
    before = snapshot()
    modes = {path: os.stat(path).st_mode for path, _, _ in os.walk(root)}
    for path in modes:
        os.chmod(path, 0o555)
    try:
        for _ in range(2):
            task = load_task(root, max_train=4)
            assert len(task.train) == 4 and task.train[0][0].mode == "RGB"
    finally:
        for path, mode in modes.items():
            os.chmod(path, mode)
    assert snapshot() == before


def test_a_cache_that_cannot_be_written_or_read_is_passed_by(tmp_path, cache, monkeypatch):
    root = write_folder(tmp_path / "pets", per_class=8)
    (tmp_path / "a-file").write_text("the cache would go under a file")
    monkeypatch.setenv(folder_cache.CACHE_DIR_ENV, str(tmp_path / "a-file" / "cache"))
    assert len(load_task(root).train) == 24 and cache() is None  # not cached, and no error
    monkeypatch.setenv(folder_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    load_task(root)
    entry = folder_cache.entry_path(os.path.realpath(root))
    entry.write_bytes(entry.read_bytes()[:100])  # torn
    assert len(load_task(root).train) == 24 and cache() == "index"
    assert load_task(root).label_names == list(CLASSES) and cache() == "cache"


def test_a_hidden_class_folder_is_skipped_with_a_warning_not_silently(tmp_path, caplog):
    import logging

    from PIL import Image as PILImage

    from attnft.data import load_task

    for name in ("cat", "dog", ".bird"):
        (tmp_path / "f" / name).mkdir(parents=True)
        for i in range(3):
            PILImage.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / "f" / name / f"{i}.png")
    with caplog.at_level(logging.WARNING, logger="attnft.data.folders"):
        task = load_task(str(tmp_path / "f"), val_fraction=0.34)
    assert task.label_names == ["cat", "dog"]
    assert any(".bird" in record.getMessage() and "hidden folder" in record.getMessage() for record in caplog.records)
