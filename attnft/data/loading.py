"""One call from a dataset name to the train and eval splits of a classification task.

``load_task`` accepts a preset name (:mod:`attnft.data.presets`), a hub id, a local
image folder (``train/`` and ``val/`` or ``test/``, each holding one folder per class),
a directory written by ``save_to_disk``, or a local copy of a hub repo; ``None`` means
Fashion-MNIST. Everything but Fashion-MNIST goes through Hugging Face ``datasets``;
the splits come back undecoded and are decoded lazily by :mod:`attnft.data.images`.
"""
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import datasets
import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Image, IterableDataset, Value
from datasets.data_files import SPLIT_KEYWORDS
from datasets.packaged_modules.imagefolder.imagefolder import IMAGE_EXTENSIONS

from ..errors import DataError
from . import fashion_mnist, inaturalist
from .images import ArrayRows, ImageClassificationDataset, ImageClassificationIterable
from .presets import FASHION_MNIST, HUB, INAT_FOLDERS, INAT_JSON, PRESETS, DatasetPreset

DEFAULT_DATASET = "fashion-mnist"
# looked for, in this order, when no eval split is named
EVAL_SPLIT_CANDIDATES = ("validation", "val", "test", "valid", "eval")
# a source without an evaluation split holds out this share of its training images
DEFAULT_VAL_FRACTION = 0.1
# the hold-out does not move with --seed: every run and `attnft eval` score the same images
HOLD_OUT_SEED = 0
# the buffer a streamed training split is shuffled through (its shards are shuffled too)
STREAM_SHUFFLE_BUFFER = 10_000
# files that mark a local copy of a hub repo (read by `datasets` like the hub would)
_DATA_FILE_EXTENSIONS = (".parquet", ".arrow", ".csv", ".json", ".jsonl", ".tar")
_IMAGE_EXTENSIONS = frozenset(IMAGE_EXTENSIONS)
_SPLIT_FOLDER_NAMES = frozenset(name for names in SPLIT_KEYWORDS.values() for name in names)

Split = ImageClassificationDataset | ImageClassificationIterable


@dataclass
class TaskData:
    """The two splits of a task; each yields ``(PIL RGB image, int label)`` before any transform.

    A map-style split returns ``None`` for an unreadable image (use
    :func:`attnft.data.images.collate_skipping_failures`); a streamed one skips it.
    """

    train: Split
    eval: Split
    label_names: list[str]
    name: str
    source: str  # where the data came from, for logs and reports
    held_out: str | None = None  # how the eval split was made when the source had none

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    @property
    def streaming(self) -> bool:
        return isinstance(self.train, ImageClassificationIterable)


@contextmanager
def quiet_datasets(progress: bool = True):
    """Inside: `datasets` shows its own progress bars ("Generating train split", "Downloading data")
    only with ``progress`` on and stderr a terminal, and logs errors only. So ``--no-progress``
    means none, and a log or a captured stderr holds what attnft says: an error is its one line."""
    from datasets.utils import logging as datasets_logging

    was_shown = datasets.is_progress_bar_enabled()
    verbosity = datasets_logging.get_verbosity()
    show = progress and was_shown and sys.stderr.isatty()
    if not show:
        datasets.disable_progress_bars()
    datasets_logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets_logging.set_verbosity(verbosity)
        if was_shown and not show:
            datasets.enable_progress_bars()


def check_batch_size(dataset, batch_size: int) -> None:
    """Raise :class:`DataError` if ``dataset`` holds fewer samples than one batch (streamed splits pass)."""
    if batch_size < 1:
        raise DataError(f"batch size must be at least 1, got {batch_size}")
    try:
        size = len(dataset)
    except TypeError:  # streamed: length unknown
        return
    if batch_size > size:
        raise DataError(f"batch size {batch_size} is larger than the dataset ({size} samples); "
                        f"pass a smaller --batch-size")


def load_task(
    dataset: str | None = None,
    *,
    data_dir: str | None = None,
    image_key: str | None = None,
    label_key: str | None = None,
    train_split: str | None = None,
    eval_split: str | None = None,
    streaming: bool | None = None,
    max_train: int | None = None,
    max_eval: int | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
) -> TaskData:
    """Train and eval splits of ``dataset``.

    ``dataset``: a preset name, a hub id (``owner/name``), a local directory, or None
    (Fashion-MNIST; with ``data_dir`` alone, that directory). ``data_dir``: where a
    preset's files are (required for iNaturalist), or a local copy to read instead of
    the hub. ``train_split`` may join splits with ``+``. ``streaming``: iterate
    without preparing the data first (None: the preset's default, else off).
    ``max_train`` / ``max_eval``: keep a seeded random subset (the first samples
    when streaming). ``val_fraction``: the share of the training images held out (seeded,
    stratified by class) when the source has no evaluation split and none is named.
    Raises :class:`DataError` for anything the user can fix.
    """
    if not 0 < val_fraction < 1:
        raise DataError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    for flag, value in (("max_train", max_train), ("max_eval", max_eval)):
        if value is not None and value < 1:
            raise DataError(f"{flag} must be at least 1, got {value}")

    if data_dir is not None:
        data_dir = os.path.abspath(os.path.expanduser(data_dir))
        if not os.path.isdir(data_dir):
            raise DataError(f"data directory not found: {data_dir}")
    if dataset is None and data_dir is None:
        dataset = DEFAULT_DATASET
    if dataset is not None and dataset.startswith("~"):
        dataset = os.path.expanduser(dataset)
    preset = PRESETS.get(dataset) if dataset is not None else None

    if preset is not None:
        image_key = image_key or preset.image_key
        label_key = label_key or preset.label_key
        train_split = train_split or preset.train_split
        eval_split = eval_split or preset.eval_split
        streaming = preset.streaming if streaming is None else streaming
        loaded = _load_preset(preset, data_dir, train_split, eval_split, streaming)
        name = preset.name
    else:
        location = data_dir or dataset
        if os.path.isdir(location):
            loaded = _load_local(location, train_split, eval_split, bool(streaming))
        elif _is_hub_id(dataset):
            loaded = _load_hf(dataset, f"hub {dataset}", train_split, eval_split, bool(streaming))
        elif _looks_like_path(dataset):
            raise DataError(f"dataset directory not found: {dataset}")
        else:
            raise DataError(f"unknown dataset or preset {dataset!r}; presets: {', '.join(PRESETS)}; "
                            f"or pass a hub id (owner/name) or a local directory")
        # a hub id names the task even when read from a local copy; a directory by its own name
        name = dataset if dataset is not None and not os.path.isdir(dataset) else os.path.basename(
            os.path.normpath(location))

    return loaded.finish(name, image_key, label_key, max_train, max_eval, val_fraction)


# ---- what each source produces before the common finishing ------------------------------------

@dataclass
class _Loaded:
    """Rows of both splits, not yet checked for columns or wrapped."""

    source: str
    train: object  # datasets.Dataset | datasets.IterableDataset | ArrayRows
    eval: object  # None: the source has no evaluation split, one is held out of train
    train_split: str
    eval_split: str | None
    label_names: list[str] | None = None  # known up front for non-hub layouts
    data_files: dict | None = None  # split -> its files, for sources `datasets` reads from files

    def finish(self, name: str, image_key, label_key, max_train, max_eval, val_fraction) -> TaskData:
        held_out = None
        if isinstance(self.train, ArrayRows):
            train, eval_ = self.train, self.eval
            image_key, label_key, label_names = "image", "label", self.label_names
        else:
            train, eval_, image_key, label_key, label_names = _prepare_columns(
                self.train, self.train if self.eval is None else self.eval, image_key, label_key, self.source)
            if self.eval is None:
                train, eval_ = _hold_out(train, label_key, label_names, val_fraction, self.source)
                held_out = (f"{len(eval_):,} images ({val_fraction:.0%}) held out of {self.train_split}, "
                            f"stratified by class, seed {HOLD_OUT_SEED} (--val-fraction); none is in both")
                self.eval_split = f"{self.train_split} (held out)"
            if isinstance(train, IterableDataset):
                train = train.shuffle(seed=0, buffer_size=STREAM_SHUFFLE_BUFFER)
                train = train.take(max_train) if max_train else train
                eval_ = eval_.take(max_eval) if max_eval else eval_
        splits = []
        for rows, split, limit in ((train, self.train_split, max_train), (eval_, self.eval_split, max_eval)):
            where = f"{self.source} [{split}]"
            if isinstance(rows, IterableDataset):
                splits.append(ImageClassificationIterable(rows, image_key, label_key, where))
                continue
            if len(rows) == 0:
                raise DataError(f"split {split!r} of {self.source} is empty")
            wrapped = ImageClassificationDataset(rows, image_key, label_key, where)
            splits.append(wrapped.subset(limit) if limit else wrapped)
        return TaskData(train=splits[0], eval=splits[1], label_names=list(label_names),
                        name=name, source=self.source, held_out=held_out)


# ---- presets ------------------------------------------------------------------------------------

def _load_preset(preset: DatasetPreset, data_dir, train_split, eval_split, streaming) -> _Loaded:
    if preset.layout == FASHION_MNIST:
        return _load_fashion_mnist(preset, data_dir, train_split, eval_split)
    if preset.layout in (INAT_JSON, INAT_FOLDERS):
        if data_dir is None:
            raise DataError(f"{preset.title} is read from a local copy: pass --data-dir ({preset.notes})")
        if preset.layout == INAT_JSON:
            return _load_inat_json(preset, data_dir, train_split, eval_split, streaming)
        return _load_inat_folders(preset, data_dir, train_split, eval_split, streaming)
    if preset.layout == HUB:
        if data_dir is not None:
            return _load_local(data_dir, train_split, eval_split, streaming)
        return _load_hf(preset.hub_id, f"hub {preset.hub_id}", train_split, eval_split, streaming)
    raise ValueError(f"preset {preset.name} has unknown layout {preset.layout!r}")


def _load_fashion_mnist(preset, data_dir, train_split, eval_split) -> _Loaded:
    arrays = {}
    for split in (train_split, eval_split):
        if split not in fashion_mnist.SPLIT_FILES:
            raise DataError(f"split {split!r} not found in Fashion-MNIST; splits: {', '.join(fashion_mnist.SPLIT_FILES)}")
        arrays[split] = ArrayRows(*fashion_mnist.read_fashion_mnist(split, root=data_dir))
    directory = fashion_mnist.fashion_mnist_source(data_dir)
    return _Loaded(f"Fashion-MNIST {directory}", arrays[train_split], arrays[eval_split],
                   train_split, eval_split, label_names=list(fashion_mnist.LABEL_NAMES))


def _load_inat_json(preset, root, train_split, eval_split, streaming) -> _Loaded:
    category_ids, names = inaturalist.inat_json_categories(root, train_split)
    splits = [inaturalist.inat_json_split(root, split, category_ids, names) for split in (train_split, eval_split)]
    if streaming:
        splits = [split.to_iterable_dataset(num_shards=_shards(split)) for split in splits]
    return _Loaded(f"{preset.title} {root}", splits[0], splits[1], train_split, eval_split)


def _load_inat_folders(preset, root, train_split, eval_split, streaming) -> _Loaded:
    classes = inaturalist.inat_folder_classes(root, train_split)
    splits = [inaturalist.inat_folder_split(root, split, classes, streaming) for split in (train_split, eval_split)]
    return _Loaded(f"{preset.title} {root}", splits[0], splits[1], train_split, eval_split)


def _shards(dataset: Dataset) -> int:
    # enough shards for DataLoader workers to share, none smaller than ~1k rows
    return max(1, min(64, len(dataset) // 1024))


# ---- local directories and the hub --------------------------------------------------------------

def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "~")) or "/" in name or os.sep in name


def _is_hub_id(name: str) -> bool:
    """``owner/name``: one slash, nothing that starts a path."""
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def _local_kind(directory: str) -> str:
    """"saved" (save_to_disk), "images" (an image folder), "files" (data files) or "empty"."""
    if any(os.path.isfile(os.path.join(directory, marker)) for marker in ("dataset_dict.json", "state.json")):
        return "saved"
    for _, _, files in os.walk(directory):
        for file in files:
            extension = os.path.splitext(file)[1].lower()
            if extension in _IMAGE_EXTENSIONS:
                return "images"
            if extension in _DATA_FILE_EXTENSIONS:
                return "files"
    return "empty"


def _load_local(directory: str, train_split, eval_split, streaming) -> _Loaded:
    kind = _local_kind(directory)
    if kind == "saved":
        return _load_saved(directory, train_split, eval_split, streaming)
    if kind == "files":
        return _load_hf(directory, f"local copy {directory}", train_split, eval_split, streaming)
    if kind == "images":
        _check_file_names(directory)
        loaded = _load_hf("imagefolder", f"image folder {directory}", train_split, eval_split, streaming,
                          data_dir=directory)
        # imagefolder names classes after the images' folders, and only when there are two or more
        classes = {split: {os.path.basename(os.path.dirname(str(f))) for f in files}
                   for split, files in (loaded.data_files or {}).items()}
        features = loaded.train.features or {}
        if "label" not in features or set(features["label"].names) <= _SPLIT_FOLDER_NAMES:
            found = set().union(*classes.values()) - _SPLIT_FOLDER_NAMES
            if len(found) == 1:
                raise DataError(f"{directory} has only one class ({found.pop()!r}): a classifier needs two class "
                                f"folders or more, as in train/<class>/ and val/<class>/")
            raise DataError(f"{directory} has images but no class folders: put them in "
                            f"train/<class>/ and val/<class>/ (or test/<class>/), two classes or more")
        _check_same_classes(classes, loaded.train_split, loaded.eval_split, directory)
        return loaded
    raise DataError(f"no images in {directory}: expected train/ and val/ (or test/) folders, "
                    f"each holding one folder of images per class")


def _check_file_names(directory: str) -> None:
    """DataError naming the first file or folder under ``directory`` whose name is not UTF-8 (``datasets`` needs it)."""
    for root, folders, files in os.walk(directory):
        for name in folders + files:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:  # os.fsdecode turned the bytes that are not UTF-8 into surrogates
                raw = os.fsencode(os.path.join(root, name))
                raise DataError(f"the name {raw!r} in {directory} is not UTF-8, which `datasets` needs: rename it "
                                f"(e.g. convmv -r -f latin1 -t utf-8 --notest {directory})") from None


def _check_same_classes(classes: dict, train_split: str, eval_split: str | None, directory: str) -> None:
    """DataError naming a class folder that one side (train or eval) has and the other lacks."""
    if eval_split is None:
        return
    sides = {}
    for side, split in (("train", train_split), ("eval", eval_split)):
        sides[side] = set().union(*(classes.get(part, set()) for part in split.split("+")))
    for side, other in (("train", "eval"), ("eval", "train")):
        missing = sorted(sides[side] - sides[other])
        if missing:
            split = {"train": train_split, "eval": eval_split}
            raise DataError(f"class {missing[0]!r} of image folder {directory} is in {split[side]} but not in "
                            f"{split[other]}" + (f" ({len(missing) - 1} more)" if len(missing) > 1 else "")
                            + ": both need the same class folders")


def _load_saved(directory: str, train_split, eval_split, streaming) -> _Loaded:
    try:
        saved = datasets.load_from_disk(directory)
    except (OSError, ValueError) as error:
        raise DataError(f"cannot read the saved dataset {directory}: {error}") from None
    if isinstance(saved, Dataset):  # a single split saved on its own
        saved = DatasetDict({"train": saved})
    train_split, eval_split = _resolve_splits(list(saved), train_split, eval_split, f"saved dataset {directory}")
    splits = [_concatenate([saved[part] for part in split.split("+")]) if split else None
              for split in (train_split, eval_split)]
    if streaming:
        splits = [split.to_iterable_dataset(num_shards=_shards(split)) if split else None for split in splits]
    return _Loaded(f"saved dataset {directory}", splits[0], splits[1], train_split, eval_split)


def _load_hf(path: str, source: str, train_split, eval_split, streaming, data_dir: str | None = None) -> _Loaded:
    """Through ``datasets``' builders; only the files of the requested splits are fetched and prepared."""
    try:
        builder = datasets.load_dataset_builder(path, data_dir=data_dir)
        available = [str(split) for split in (builder.config.data_files or builder.info.splits or {})]
        train_split, eval_split = _resolve_splits(available, train_split, eval_split, source)
        needed = {part for split in (train_split, eval_split) if split for part in split.split("+")}
        data_files = None
        if builder.config.data_files:
            data_files = {split: list(files) for split, files in builder.config.data_files.items() if str(split) in needed}
        loaded = datasets.load_dataset(path, data_files=data_files, streaming=streaming)
    except ConnectionError as error:
        raise _hub_error(path, source, error) from None
    except datasets.exceptions.DatasetNotFoundError:
        raise DataError(f"dataset {path!r} not found on the hub (nor as a local directory); "
                        f"presets: {', '.join(PRESETS)}") from None
    except FileNotFoundError as error:
        raise DataError(f"no data files for {source}: {error}") from None
    except datasets.exceptions.DatasetGenerationError as error:
        raise DataError(f"cannot prepare {source}: {error.__cause__ or error}") from None
    splits = [_concatenate([loaded[part] for part in split.split("+")]) if split else None
              for split in (train_split, eval_split)]
    return _Loaded(source, splits[0], splits[1], train_split, eval_split, data_files=data_files)


def _hub_error(path: str, source: str, error: Exception) -> DataError:
    instead = (f"pass --data-dir with a local copy (huggingface-cli download --repo-type dataset {path} "
               f"--local-dir DIR) or a directory written by save_to_disk")
    if datasets.config.HF_HUB_OFFLINE:
        return DataError(f"{path} is not a local directory, and the hub is off "
                         f"(HF_DATASETS_OFFLINE/HF_HUB_OFFLINE); {instead}")
    return DataError(f"cannot reach the hub for {source} ({error}); {instead}")


def _resolve_splits(available: list[str], train_split, eval_split, source: str) -> tuple[str, str | None]:
    """Default and check the split names; ``+`` joins several. The eval split is None when
    none was named and the source has none of :data:`EVAL_SPLIT_CANDIDATES`."""
    train_split = train_split or "train"
    if eval_split is None:
        eval_split = next((split for split in EVAL_SPLIT_CANDIDATES if split in available), None)
    resolved = []
    for split in (train_split, eval_split):
        if split is None:  # no evaluation split: the caller holds one out of train
            resolved.append(None)
            continue
        parts = []
        for asked in split.split("+"):
            # an image folder's val/ is the split "validation"
            part = asked if asked in available else _SPLIT_ALIASES.get(asked, asked)
            if part not in available:
                raise DataError(f"split {asked!r} not found in {source}; splits: {', '.join(available)}")
            parts.append(part)
        resolved.append("+".join(parts))
    return resolved[0], resolved[1]


_SPLIT_ALIASES = {"val": "validation", "valid": "validation", "validation": "val"}


def _hold_out(train, label_key: str, label_names: list[str], fraction: float, source: str):
    """(train, eval): a seeded share ``fraction`` of ``train`` held out, stratified by class."""
    if isinstance(train, IterableDataset):
        raise DataError(f"{source} has no evaluation split to stream; pass --eval-split")
    if not isinstance(train.features[label_key], ClassLabel):  # stratifying needs class labels
        train = train.cast_column(label_key, ClassLabel(names=label_names))
    counts = np.bincount(train[label_key], minlength=len(label_names))
    if counts.min() < 2:
        rare = label_names[int(counts.argmin())]
        raise DataError(f"class {rare!r} of {source} has {counts.min()} image(s): holding out an evaluation "
                        f"split needs two or more per class; add images or pass --eval-split")
    parts = train.train_test_split(test_size=fraction, stratify_by_column=label_key, seed=HOLD_OUT_SEED)
    return parts["train"], parts["test"]


def _concatenate(parts: list):
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


# ---- columns and labels -------------------------------------------------------------------------

def _prepare_columns(train, eval_, image_key, label_key, source):
    """Pick (or check) the image and label columns, keep only them, undecode images, name the classes."""
    if isinstance(train, IterableDataset) and train.features is None:
        train, eval_ = train._resolve_features(), eval_._resolve_features()  # reads the first row
    features = train.features
    columns = list(features)
    image_key = _pick_column(image_key, columns, features, Image, ("image", "img"), "image", source)
    label_key = _pick_column(label_key, columns, features, ClassLabel, ("label", "labels"), "label", source)
    missing = [key for key in (image_key, label_key) if eval_.features is not None and key not in eval_.features]
    if missing:
        raise DataError(f"column {missing[0]!r} missing from the eval split of {source}; "
                        f"columns: {', '.join(eval_.features)}")
    train, eval_ = train.select_columns([image_key, label_key]), eval_.select_columns([image_key, label_key])
    if isinstance(features[image_key], Image):
        train = train.cast_column(image_key, Image(decode=False))
        eval_ = eval_.cast_column(image_key, Image(decode=False))
    train, eval_, label_names = _class_names(train, eval_, label_key, source)
    return train, eval_, image_key, label_key, label_names


def _check_label_range(rows, label_key: str, feature: ClassLabel, source: str) -> None:
    """DataError if a ClassLabel column holds a value outside its names (``datasets`` does not check what
    a saved table holds): found at load time, not as an index error in the middle of training."""
    if isinstance(rows, IterableDataset):
        return  # a stream is not read ahead
    import pyarrow.compute as pc

    column = rows.data.column(label_key)
    classes = f"0-{feature.num_classes - 1} for its {feature.num_classes} class names"
    if column.null_count:
        raise DataError(f"label column {label_key!r} of {source} has {column.null_count} row(s) without a label; "
                        f"drop them, or give them one of {classes}")
    if len(column) == 0:
        return
    low, high = (value.as_py() for value in pc.min_max(column).values())
    bad = low if low < 0 else high if high >= feature.num_classes else None
    if bad is not None:
        what = " (no label)" if bad == -1 else ""
        raise DataError(f"label column {label_key!r} of {source} holds {bad}{what}, outside {classes}; "
                        f"fix the labels or the ClassLabel names")


def _pick_column(key, columns, features, feature_type, usual_names, what, source) -> str:
    flag = f"--{what}-key"
    if key is not None:
        if key not in columns:
            raise DataError(f"{what} column {key!r} not found in {source}; columns: {', '.join(columns)}")
        return key
    typed = [column for column in columns if isinstance(features[column], feature_type)]
    if len(typed) == 1:
        return typed[0]
    for name in usual_names:
        if name in (typed or columns):
            return name
    raise DataError(f"cannot tell which column of {source} holds the {what}; columns: {', '.join(columns)}; "
                    f"pass {flag}")


def _class_names(train, eval_, label_key, source):
    feature = train.features[label_key]
    if isinstance(feature, ClassLabel):
        for rows in (train,) if eval_ is train else (train, eval_):
            _check_label_range(rows, label_key, feature, source)
        return train, eval_, list(feature.names)
    if isinstance(train, IterableDataset):
        raise DataError(f"label column {label_key!r} of {source} has no class names (it is not a ClassLabel), "
                        f"which streaming needs; load without streaming")
    if isinstance(feature, Value) and feature.dtype.startswith(("int", "uint")):
        highest = max(max(train[label_key]), max(eval_[label_key]))
        lowest = min(min(train[label_key]), min(eval_[label_key]))
        if lowest < 0:
            raise DataError(f"label column {label_key!r} of {source} holds negative labels")
        return train, eval_, [str(label) for label in range(highest + 1)]
    if isinstance(feature, Value) and feature.dtype in ("string", "large_string"):
        names = sorted(set(train.unique(label_key)) | set(eval_.unique(label_key)))
        encoded = ClassLabel(names=names)
        return train.cast_column(label_key, encoded), eval_.cast_column(label_key, encoded), names
    raise DataError(f"label column {label_key!r} of {source} holds {feature}, not class labels; pass --label-key")
