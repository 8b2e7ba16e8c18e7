"""Where a task's images come from: presets, local folders and copies, the hub — each read into undecoded rows.

:func:`attnft.data.loading.load_task` picks the source and finishes what each gives here (columns,
hold-out, subsets) the same way for all.
"""
import json
import os
from dataclasses import dataclass

import datasets
from datasets import ClassLabel, Dataset

from ..core.errors import DataError, first_line
from ..core.parsing import short
from . import fashion_mnist, folder_cache, folders, inaturalist
from .images import ArrayRows
from .presets import FASHION_MNIST, HUB, INAT_FOLDERS, INAT_JSON, PRESETS, DatasetPreset

# looked for, in this order, when no eval split is named
EVAL_SPLIT_CANDIDATES = ("validation", "val", "test", "valid", "eval")
# files that mark a local copy of a hub repo (read by `datasets` like the hub would)
_DATA_FILE_EXTENSIONS = (".parquet", ".arrow", ".csv", ".json", ".jsonl", ".tar")


@dataclass
class Loaded:
    """Rows of both splits, not yet checked for columns or wrapped."""

    source: str
    train: object  # datasets.Dataset | datasets.IterableDataset | ArrayRows
    eval: object  # None: the source has no evaluation split, one is held out of train
    train_split: str
    eval_split: str | None
    label_names: list[str] | None = None  # known up front for non-hub layouts
    data_files: dict | None = None  # split -> its files, for sources `datasets` reads from files


# ---- presets ------------------------------------------------------------------------------------

def load_preset(preset: DatasetPreset, data_dir, train_split, eval_split, streaming, inat_category="name") -> Loaded:
    if preset.layout == FASHION_MNIST:
        return _load_fashion_mnist(preset, data_dir, train_split, eval_split)
    if preset.layout in (INAT_JSON, INAT_FOLDERS):
        if data_dir is None:
            raise DataError(f"{preset.title} is read from a local copy: pass --data-dir ({preset.notes})")
        if preset.layout == INAT_JSON:
            return _load_inat_json(preset, data_dir, train_split, eval_split, streaming, inat_category)
        return _load_inat_folders(preset, data_dir, train_split, eval_split, streaming)
    if preset.layout == HUB:
        if data_dir is not None:
            loaded = load_local(data_dir, train_split, eval_split, streaming)
        else:
            at = f"@{preset.revision[:12]}" if preset.revision else ""
            loaded = load_hub(preset.hub_id, f"hub {preset.hub_id}{at}", train_split, eval_split, streaming,
                              revision=preset.revision)
        _check_split_sizes(preset, loaded)
        return loaded
    raise ValueError(f"preset {preset.name} has unknown layout {preset.layout!r}")


def _check_split_sizes(preset: DatasetPreset, loaded: Loaded) -> None:
    """A DataError when a split of the preset's standard split has another number of images than it: a copy that
    is not the benchmark (a later push, a partial download) is never scored as if it were. A streamed split has no
    length before it is read, and is not checked."""
    for split, data in ((loaded.train_split, loaded.train), (loaded.eval_split, loaded.eval)):
        expected = preset.expected_size(split) if split else None
        if expected is None or not hasattr(data, "__len__") or len(data) == expected:
            continue
        raise DataError(f"split {split!r} of {loaded.source} has {len(data):,} images, {preset.title}'s standard "
                        f"split has {expected:,}: this is not the benchmark copy (pass its location as --dataset to "
                        f"use it as it is)")


def _load_fashion_mnist(preset, data_dir, train_split, eval_split) -> Loaded:
    arrays = {}
    for split in (train_split, eval_split):
        if split not in fashion_mnist.SPLIT_FILES:
            raise DataError(f"split {split!r} not found in Fashion-MNIST; splits: {', '.join(fashion_mnist.SPLIT_FILES)}")
        arrays[split] = ArrayRows(*fashion_mnist.read_fashion_mnist(split, root=data_dir))
    directory = fashion_mnist.fashion_mnist_source(data_dir)
    return Loaded(f"Fashion-MNIST {directory}", arrays[train_split], arrays[eval_split],
                   train_split, eval_split, label_names=list(fashion_mnist.LABEL_NAMES))


def _load_inat_json(preset, root, train_split, eval_split, streaming, level) -> Loaded:
    classes = inaturalist.inat_json_classes(root, train_split, level)
    splits = [inaturalist.inat_json_split(root, split, classes, streaming) for split in (train_split, eval_split)]
    return Loaded(f"{preset.title} {root}", splits[0], splits[1], train_split, eval_split)


def _load_inat_folders(preset, root, train_split, eval_split, streaming) -> Loaded:
    classes = inaturalist.inat_folder_classes(root, train_split)
    splits = [inaturalist.inat_folder_split(root, split, classes, streaming) for split in (train_split, eval_split)]
    return Loaded(f"{preset.title} {root}", splits[0], splits[1], train_split, eval_split)


# ---- local directories and the hub --------------------------------------------------------------

def looks_like_path(name: str) -> bool:
    return name.startswith((".", "~")) or "/" in name or os.sep in name


def is_hub_id(name: str) -> bool:
    """``owner/name``: one slash, nothing that starts a path."""
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


_MAX_KIND_DEPTH = 3


def _local_kind(directory: str) -> str:
    """"saved" (save_to_disk), "images" (an image folder), "files" (data files) or "empty"."""
    if any(os.path.isfile(os.path.join(directory, marker)) for marker in ("dataset_dict.json", "state.json")):
        return "saved"
    for root, dirs, files in os.walk(directory):
        if root.count(os.sep) - directory.rstrip(os.sep).count(os.sep) >= _MAX_KIND_DEPTH:
            dirs.clear()  # train/<class>/<image> is as deep as a dataset's layout goes: never walk a whole disk
        for file in files:
            extension = os.path.splitext(file)[1].lower()
            if extension in folders.IMAGE_EXTENSIONS:
                return "images"
            if extension in _DATA_FILE_EXTENSIONS:
                return "files"
    return "empty"


def load_local(directory: str, train_split, eval_split, streaming) -> Loaded:
    kind = _local_kind(directory)
    if kind == "saved":
        return _load_saved(directory, train_split, eval_split, streaming)
    if kind == "files":
        return load_hub(directory, f"local copy {directory}", train_split, eval_split, streaming)
    if kind == "images":
        return _load_image_folder(directory, train_split, eval_split, streaming)
    raise DataError(f"no images in {directory}: expected train/ and val/ (or test/) folders, "
                    f"each holding one folder of images per class")


def _load_image_folder(directory: str, train_split, eval_split, streaming) -> Loaded:
    """An image folder from one walk, its index cached by the listing; datasets reads what only it can."""
    listing = folders.list_folder(directory)
    index = folder_cache.read(listing, train_split, eval_split)
    if index is None:
        index = _index_image_folder(listing, directory, train_split, eval_split)
        if index is None:
            return _load_image_folder_with_datasets(directory, train_split, eval_split, streaming)
        folder_cache.write(listing, train_split, eval_split, index)
    splits = [folders.image_path_dataset(index.rows[split], index.label_names, streaming) if split else None
              for split in (index.train_split, index.eval_split)]
    return Loaded(f"image folder {directory}", splits[0], splits[1], index.train_split, index.eval_split,
                  label_names=list(index.label_names))


def _index_image_folder(listing, directory: str, train_split, eval_split) -> folders.FolderIndex | None:
    """The folder's rows for these splits; None where imagefolder reads more than class folders."""
    source = f"image folder {directory}"
    files = folders.split_files(listing)
    if files is None:
        return None
    if not files:
        raise DataError(f"no data files for {source}: nothing datasets would read in {listing.root}")
    train_split, eval_split = _resolve_splits(list(files), train_split, eval_split, source)
    parts = {part: files[part] for split in (train_split, eval_split) if split for part in split.split("+")}
    if folders.needs_datasets([path for part in parts.values() for path in part]):
        return None
    return folders.folder_index(listing, parts, train_split, eval_split, directory)


def _load_image_folder_with_datasets(directory: str, train_split, eval_split, streaming) -> Loaded:
    """What imagefolder reads beyond class folders (metadata files, zip archives, sharded names): through it."""
    loaded = load_hub("imagefolder", f"image folder {directory}", train_split, eval_split, streaming,
                      data_dir=directory)
    label = (loaded.train.features or {}).get("label")
    if label is not None and not isinstance(label, ClassLabel):
        return loaded  # a metadata file's labels (named later), not the folders'
    # imagefolder names classes after the images' folders, and only when there are two or more
    classes = {split: {os.path.basename(os.path.dirname(str(f))) for f in files}
               for split, files in (loaded.data_files or {}).items()}
    if label is None or set(label.names) <= folders.SPLIT_FOLDER_NAMES:
        raise folders.no_classes_error(classes, directory)
    folders.check_same_classes(classes, loaded.train_split, loaded.eval_split, directory)
    return loaded


def _load_saved(directory: str, train_split, eval_split, streaming) -> Loaded:
    """A ``save_to_disk`` folder: only the splits asked for are read (an empty one is refused by name)."""
    source = f"saved dataset {directory}"
    split_folders = _saved_split_folders(directory)
    train_split, eval_split = _resolve_splits(list(split_folders), train_split, eval_split, source)
    splits = [_concatenate([_read_saved_split(split_folders[part], part, source) for part in split.split("+")])
              if split else None for split in (train_split, eval_split)]
    if streaming:
        splits = [split.to_iterable_dataset(num_shards=folders.stream_shards(len(split))) if split else None
                  for split in splits]
    return Loaded(f"saved dataset {directory}", splits[0], splits[1], train_split, eval_split)


def _saved_split_folders(directory: str) -> dict[str, str]:
    """split -> its folder: those ``dataset_dict.json`` lists, or ``train`` for a Dataset saved on its own."""
    listing = os.path.join(directory, datasets.config.DATASETDICT_JSON_FILENAME)
    if not os.path.isfile(listing):
        return {"train": directory}
    try:
        with open(listing) as f:
            names = json.load(f)["splits"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(f"cannot read the saved dataset {directory}: {listing}: {short(error)}") from None
    return {str(name): os.path.join(directory, str(name)) for name in names}


def _read_saved_split(folder: str, split: str, source: str) -> Dataset:
    try:
        with open(os.path.join(folder, datasets.config.DATASET_STATE_JSON_FILENAME)) as f:
            empty = not json.load(f).get("_data_files")  # save_to_disk writes no Arrow file for 0 rows
        if empty:
            raise DataError(f"split {split!r} of {source} is empty")
        return Dataset.load_from_disk(folder)
    except (OSError, ValueError, AttributeError) as error:
        raise DataError(f"cannot read split {split!r} of {source}: {short(error)}") from None


def load_hub(path: str, source: str, train_split, eval_split, streaming, data_dir: str | None = None,
             revision: str | None = None) -> Loaded:
    """Through ``datasets``' builders, at ``revision`` (None: the head); only the files of the requested splits
    are fetched and prepared."""
    try:
        builder = datasets.load_dataset_builder(path, data_dir=data_dir, revision=revision)
        available = [str(split) for split in (builder.config.data_files or builder.info.splits or {})]
        train_split, eval_split = _resolve_splits(available, train_split, eval_split, source)
        needed = {part for split in (train_split, eval_split) if split for part in split.split("+")}
        data_files = None
        if builder.config.data_files:
            data_files = {split: list(files) for split, files in builder.config.data_files.items() if str(split) in needed}
        loaded = datasets.load_dataset(path, data_files=data_files, streaming=streaming, revision=revision)
    except ConnectionError as error:
        raise _hub_error(path, source, error, (train_split, eval_split), revision) from None
    except datasets.exceptions.DatasetNotFoundError as error:
        if revision is not None:  # datasets' own line names the commit that is missing
            raise DataError(first_line(error)) from None
        raise DataError(f"dataset {path!r} not found on the hub (nor as a local directory); "
                        f"presets: {', '.join(PRESETS)}") from None
    except FileNotFoundError as error:
        raise DataError(f"no data files for {source}: {error}") from None
    except datasets.exceptions.DatasetGenerationError as error:
        raise DataError(f"cannot prepare {source}: {error.__cause__ or error}") from None
    except (IndexError, KeyError, TypeError) as error:
        if not os.path.isdir(path):
            raise  # a hub dataset's own bug, not the user's folder
        # a folder datasets' builders cannot read (its files of mixed kinds, a whole file system: --dataset /)
        raise DataError(f"cannot read {source} as a dataset ({type(error).__name__}: {short(str(error))}): pass a folder "
                        "of images (train/ and val/ or test/, or class folders), data files, or a save_to_disk "
                        "folder") from None
    splits = [_concatenate([loaded[part] for part in split.split("+")]) if split else None
              for split in (train_split, eval_split)]
    return Loaded(source, splits[0], splits[1], train_split, eval_split, data_files=data_files)


def download_command(path: str, splits=(), revision: str | None = None) -> str:
    """The command that copies hub dataset ``path`` (at ``revision``) for ``--data-dir``: only the named splits'
    files when they are known (``data/<split>-*``, as ``push_to_hub`` names them, and the card that holds the
    features)."""
    parts = sorted({part for split in splits if split for part in split.split("+")})
    include = "".join(f' --include "{pattern}"' for pattern in ["README.md"] + [f"data/{part}-*" for part in parts])
    at = f" --revision {revision}" if revision else ""
    return f"hf download {path} --repo-type dataset{at}{include if parts else ''} --local-dir DIR"


def _hub_error(path: str, source: str, error: Exception, splits=(), revision: str | None = None) -> DataError:
    instead = (f"pass --data-dir with a local copy ({download_command(path, splits, revision)}) or a directory "
               "written by save_to_disk")
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


def _concatenate(parts: list):
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
