"""One call from a dataset name to the train and eval splits of a classification task.

``load_task`` accepts a preset name (:mod:`attnft.data.presets`), a hub id, a local
image folder (``train/`` and ``val/`` or ``test/``, each holding one folder per class),
a directory written by ``save_to_disk``, or a local copy of a hub repo; ``None`` means
Fashion-MNIST. Everything but Fashion-MNIST goes through Hugging Face ``datasets``;
the splits come back undecoded and are decoded lazily by :mod:`attnft.data.images`.
"""
import math
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import datasets
import numpy as np
from datasets import ClassLabel, Image, IterableDataset, Value
from datasets.utils.stratify import stratified_shuffle_split_generate_indices

from ..core.errors import DataError
from .folders import list_folder
from .images import ArrayRows, ImageClassificationDataset, ImageClassificationIterable
from .presets import PRESETS, takes_inat_category
from .sources import Loaded, is_hub_id, load_hub, load_local, load_preset, looks_like_path

DEFAULT_DATASET = "fashion-mnist"
# a source without an evaluation split holds out this share of its training images
DEFAULT_VAL_FRACTION = 0.1
# the hold-out does not move with --seed: every run and `attnft eval` score the same images
HOLD_OUT_SEED = 0
# the buffer a streamed training split is shuffled through (its shards are shuffled too)
STREAM_SHUFFLE_BUFFER = 10_000

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
    inat_category: str = "name",
    search_holdout: float | None = None,
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
    ``inat_category``: the taxonomic level iNaturalist 2018/2019 is classified at (``name``, the
    species; ``genus``, ``family``, ...; read from the copy's ``categories.json``).
    ``search_holdout``: a hyperparameter search's split: this share of the training split (seeded,
    stratified) becomes the eval split, the rest the train split, and the evaluation split is not read.
    Raises :class:`DataError` for anything the user can fix.
    """
    if not 0 < val_fraction < 1:
        raise DataError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    if search_holdout is not None and not 0 < search_holdout < 1:
        raise DataError(f"search_holdout must be between 0 and 1, got {search_holdout}")
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
    if inat_category != "name" and not takes_inat_category(dataset):
        json_presets = ", ".join(name for name in PRESETS if takes_inat_category(name))
        raise DataError(f"--inat-category is for the iNaturalist presets with a taxonomy ({json_presets}), "
                        f"not {dataset or 'the default dataset'}")

    if preset is not None:
        image_key = image_key or preset.image_key
        label_key = label_key or preset.label_key
        train_split = train_split or preset.train_split
        eval_split = eval_split or preset.eval_split
        streaming = preset.streaming if streaming is None else streaming
        loaded = load_preset(preset, data_dir, train_split, eval_split, streaming, inat_category)
        name = preset.name
    else:
        location = data_dir or dataset
        if os.path.isdir(location):
            loaded = load_local(location, train_split, eval_split, bool(streaming))
        elif is_hub_id(dataset):
            loaded = load_hub(dataset, f"hub {dataset}", train_split, eval_split, bool(streaming))
        elif looks_like_path(dataset):
            raise DataError(f"dataset directory not found: {dataset}")
        else:
            raise DataError(f"unknown dataset or preset {dataset!r}; presets: {', '.join(PRESETS)}; "
                            f"or pass a hub id (owner/name) or a local directory")
        # a hub id names the task even when read from a local copy; a directory by its own name
        name = dataset if dataset is not None and not os.path.isdir(dataset) else os.path.basename(
            os.path.normpath(location))

    return _finish(loaded, name, image_key, label_key, max_train, max_eval, val_fraction, search_holdout)


def data_fingerprint(dataset: str | None, data_dir: str | None) -> str | None:
    """What the local folder ``load_task(dataset, data_dir=data_dir)`` reads holds (:attr:`folders.Listing.fingerprint`:
    its files, so its classes and images), from one walk; None where the task is read from the hub or a preset's
    own files. DataError for a folder that cannot be read."""
    location = local_folder(dataset, data_dir)
    return list_folder(location).fingerprint if location is not None else None


def local_folder(dataset: str | None, data_dir: str | None) -> str | None:
    """The local folder ``load_task(dataset, data_dir=data_dir)`` reads (as given, ``~`` expanded); None for the hub
    or a preset's own files."""
    if data_dir is None and (dataset is None or dataset in PRESETS):
        return None
    location = os.path.expanduser(data_dir or dataset)
    return location if os.path.isdir(location) else None


def _finish(loaded: Loaded, name: str, image_key, label_key, max_train, max_eval, val_fraction,
            search_fraction: float | None = None) -> TaskData:
    """The task from a source's rows: columns checked, an eval split held out if it has none, subsets drawn."""
    held_out = None
    if isinstance(loaded.train, ArrayRows):
        train, eval_ = loaded.train, loaded.eval
        image_key, label_key, label_names = "image", "label", loaded.label_names
    else:
        train, eval_, image_key, label_key, label_names = _prepare_columns(
            loaded.train, loaded.train if loaded.eval is None else loaded.eval, image_key, label_key, loaded.source)
        if loaded.eval is None:
            train, eval_ = _hold_out(train, label_key, label_names, val_fraction, loaded.source)
            held_out = (f"{len(eval_):,} images ({val_fraction:.0%}) held out of {loaded.train_split}, "
                        f"stratified by class, seed {HOLD_OUT_SEED} (--val-fraction); none is in both")
            loaded.eval_split = f"{loaded.train_split} (held out)"
    if search_fraction is not None:  # a search's trials: scored on part of the training split, never on the eval split
        train, eval_ = _hold_out(train, label_key, label_names, search_fraction, loaded.source)
        held_out = (f"{len(eval_):,} images ({search_fraction:.0%}) of {loaded.train_split} held out for the search "
                    f"(--search-holdout), stratified by class, seed {HOLD_OUT_SEED}; the evaluation split is not read")
        loaded.eval_split = f"{loaded.train_split} (search hold-out)"
    if not isinstance(train, ArrayRows):
        if isinstance(train, IterableDataset):
            train = train.shuffle(seed=0, buffer_size=STREAM_SHUFFLE_BUFFER)
            train = train.take(max_train) if max_train else train
            eval_ = eval_.take(max_eval) if max_eval else eval_
    splits = []
    for rows, split, limit in ((train, loaded.train_split, max_train), (eval_, loaded.eval_split, max_eval)):
        where = f"{loaded.source} [{split}]"
        if isinstance(rows, IterableDataset):
            splits.append(ImageClassificationIterable(rows, image_key, label_key, where))
            continue
        if len(rows) == 0:
            raise DataError(f"split {split!r} of {loaded.source} is empty")
        if isinstance(rows, datasets.Dataset):
            rows = ArrowRows(rows, image_key, label_key)
        wrapped = ImageClassificationDataset(rows, image_key, label_key, where)
        splits.append(wrapped.subset(limit) if limit else wrapped)
    return TaskData(train=splits[0], eval=splits[1], label_names=list(label_names),
                    name=name, source=loaded.source, held_out=held_out)


class ArrowRows:
    """``rows[i]`` of a ``datasets.Dataset`` read from its Arrow table: ``{image_key: stored value, label_key:
    int}``, what ``Dataset[i]`` gives for an undecoded image, without its per-row formatting (30-100 µs a sample,
    shuffled: a third of a 64-image batch's loading time at 28 px). Pickled as the dataset itself (a memory-mapped
    table travels by its path); each process finds the columns again on first use."""

    def __init__(self, dataset: datasets.Dataset, image_key: str, label_key: str):
        self.dataset = dataset
        self.image_key = image_key
        self.label_key = label_key
        self._columns = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        if self._columns is None:
            table, indices = self.dataset.data, self.dataset._indices  # the rows a select() kept, if any
            self._columns = (table.column(self.image_key), table.column(self.label_key),
                             None if indices is None else indices.column(0))
        images, labels, indices = self._columns
        if index >= len(self.dataset):
            raise IndexError(f"row {index} of {len(self.dataset)}")
        row = index if indices is None else indices[index].as_py()
        return {self.image_key: images[row].as_py(), self.label_key: labels[row].as_py()}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_columns": None}


def _hold_out(train, label_key: str, label_names: list[str], fraction: float, source: str):
    """(train, eval): a seeded share ``fraction`` of ``train`` held out, stratified by class.

    The indices ``Dataset.train_test_split(test_size=fraction, stratify_by_column=..., seed=HOLD_OUT_SEED)``
    draws, from the same function and generator, without its reading the label column row by row
    (seconds per 10k rows)."""
    if isinstance(train, IterableDataset):
        raise DataError(f"{source} has no evaluation split to stream; pass --eval-split")
    if isinstance(train, ArrayRows):
        kept, held = _held_out_indices(np.asarray(train.labels), label_names, fraction, source)
        return ArrayRows(train.images[kept], train.labels[kept]), ArrayRows(train.images[held], train.labels[held])
    if not isinstance(train.features[label_key], ClassLabel):  # stratifying needs class labels
        train = train.cast_column(label_key, ClassLabel(names=label_names))
    labels = train.with_format("arrow", columns=[label_key])[:][label_key].to_numpy()
    kept, held = _held_out_indices(labels, label_names, fraction, source)
    # in memory: nothing is written beside a saved dataset (its folder may be read-only)
    return train.select(kept, keep_in_memory=True), train.select(held, keep_in_memory=True)


def _held_out_indices(labels: np.ndarray, label_names: list[str], fraction: float, source: str):
    """(kept, held): the row indices of a seeded, stratified hold-out of ``fraction`` of ``labels``."""
    counts = np.bincount(labels, minlength=len(label_names))
    if counts.min() < 2:
        rare = label_names[int(counts.argmin())]
        raise DataError(f"class {rare!r} of {source} has {counts.min()} image(s): holding out an evaluation "
                        f"split needs two or more per class; add images or pass --eval-split")
    n_test = math.ceil(fraction * len(labels))
    n_classes = int((counts > 0).sum())
    if min(n_test, len(labels) - n_test) < n_classes:
        raise DataError(f"holding out {fraction} of {source} gives {n_test} of {len(labels)} images, fewer than "
                        f"its {n_classes} classes on one side; pass another --val-fraction or --eval-split")
    generator = np.random.default_rng(HOLD_OUT_SEED)
    return next(stratified_shuffle_split_generate_indices(labels, len(labels) - n_test, n_test, rng=generator))


def _prepare_columns(train, eval_, image_key, label_key, source):
    """Pick (or check) the image and label columns, keep only them, undecode images, name the classes."""
    if isinstance(train, IterableDataset) and train.features is None:
        train, eval_ = train._resolve_features(), eval_._resolve_features()  # reads the first row
    features = train.features
    columns = list(features)
    image_key = _pick_column(image_key, columns, features, Image, ("image", "img"), "image", source)
    label_key = _pick_column(label_key, columns, features, ClassLabel, ("label", "labels"), "label", source)
    if label_key == image_key:
        raise DataError(f"the label column and the image column of {source} are both {image_key!r}: name the label "
                        f"column with --label-key (columns: {', '.join(columns)})")
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
