"""An image folder in one directory walk: its split folders, class folders and rows, by ``datasets``' own rules.

``datasets``' imagefolder resolves the default split patterns (``**/train/**``, ``**/val[-._ 0-9]*/**``, ...)
with one fsspec glob each, then every file found as a pattern of its own: ~500k ``info`` calls for 10k images.
Here the same patterns (``datasets.data_files``) are matched against one in-memory listing, so a folder costs a
walk. What comes out is what imagefolder gave: the same splits, the same files in the same order (each pattern's
matches sorted as strings, patterns in datasets' order), class names from the images' parent folders, sorted,
only when there are two or more at one depth. Hidden files and folders and ``__*`` folders are skipped, as
datasets skips them; a symlinked file is read, a symlinked folder is not entered. What imagefolder would read
differently (metadata files, zip archives, sharded ``data/<split>-00000-of-00001.*`` names) is left to it.
"""
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from datasets import ClassLabel, Dataset, DatasetInfo, Features, Image, IterableDataset, Value
from datasets.data_files import ALL_DEFAULT_PATTERNS, ALL_SPLIT_PATTERNS, FILES_TO_IGNORE, SPLIT_KEYWORDS
from datasets.packaged_modules.folder_based_builder.folder_based_builder import FolderBasedBuilder
from datasets.packaged_modules.imagefolder.imagefolder import IMAGE_EXTENSIONS as _EXTENSIONS
from datasets.table import InMemoryTable, table_cast
from fsspec.utils import glob_translate

from ..core.errors import DataError

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset(_EXTENSIONS)
SPLIT_FOLDER_NAMES = frozenset(name for names in SPLIT_KEYWORDS.values() for name in names)
_IGNORED_NAMES = frozenset(FILES_TO_IGNORE)
_METADATA_NAMES = frozenset(FolderBasedBuilder.METADATA_FILENAMES)
# a glob's magic: what is left between these is matched literally
_MAGIC = re.compile(r"\[[^\]]*\]|[*?]")


@dataclass(frozen=True)
class Listing:
    """The files under an image folder that ``datasets`` would see, from one walk.

    ``root``: the folder's real path (POSIX). ``folders``: each folder's path relative to it ("" for the root, else
    ending in "/") -> its files' names, in the order of the walk. ``key``: sha256 of every path, in that order:
    an added, removed or renamed file, or a file that is no longer one (a broken link), moves it (a folder the
    file system lists in another order only costs one re-index). What an index is made from is the names alone (a
    folder with a metadata file or an archive goes through ``datasets``, uncached), so an image edited in place
    keeps it, and the walk needs no ``stat`` per file: ``DirEntry.is_file`` answers from the directory itself.
    """

    root: str
    folders: dict[str, list[str]]
    key: str

    @property
    def fingerprint(self) -> str:
        """What the folder holds, in a few words: its files' count and a sha256 of their paths (relative to the
        folder, sorted: the same in any file system's order and at any path). A class folder or an image added,
        removed or renamed changes it; an image edited in place does not."""
        paths = sorted(folder + name for folder, names in self.folders.items() for name in names)
        digest = hashlib.sha256("\0".join(paths).encode(errors="surrogateescape")).hexdigest()
        return f"{len(paths)} files, sha256 {digest[:16]}"


@dataclass
class FolderIndex:
    """One request's view of a folder: the split names it resolved to, the class names, and the rows of the train
    and eval splits (``{split: table of "path" (absolute), "label"}``), in datasets' order."""

    train_split: str
    eval_split: str | None
    label_names: list[str]
    rows: dict[str, pa.Table]


def list_folder(directory: str) -> Listing:
    """Walk ``directory`` once (a ``stat`` only for a symbolic link). DataError for a name that is not UTF-8, or a
    folder that cannot be read."""
    root = Path(directory).expanduser().resolve().as_posix()
    digest = hashlib.sha256(root.encode(errors="surrogateescape"))
    folders, pending = {}, [""]
    while pending:
        folder = pending.pop()
        names = _list_one(root, folder, directory, pending)
        digest.update("\0".join([f"\0{folder}", *names]).encode(errors="surrogateescape"))
        if names:
            folders[folder] = names
    return Listing(root, folders, digest.hexdigest())


def _list_one(root: str, folder: str, directory: str, pending: list[str]) -> list[str]:
    """The files of one folder in the file system's order; its sub-folders go to ``pending``."""
    try:
        with os.scandir(f"{root}/{folder}" if folder else root) as it:
            entries = list(it)
    except OSError as error:
        raise DataError(f"cannot read the image folder {root}/{folder}: {error.strerror}") from None
    names = []
    for entry in entries:
        name = entry.name
        if not name.isascii():
            _check_utf8(entry.path, directory)
        if name[0] == ".":  # hidden: datasets never matches it
            if entry.is_dir(follow_symlinks=False) and name not in (".git", ".ipynb_checkpoints"):
                logger.warning("skipping the hidden folder %s/%s%s and what it holds (a leading dot hides it): rename "
                               "it to use its images", root, folder, name)
            continue
        if entry.is_dir(follow_symlinks=False):
            if not name.startswith("__"):  # datasets' "special" folders (__pycache__)
                pending.append(f"{folder}{name}/")
            continue
        try:
            regular = entry.is_file()  # a symlink's target (a broken one: False)
        except OSError:  # gone since the listing
            continue
        if regular and name not in _IGNORED_NAMES:
            names.append(name)
    return names


def _check_utf8(path: str, directory: str) -> None:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode turned the bytes that are not UTF-8 into surrogates
        raise DataError(f"the name {os.fsencode(path)!r} in {directory} is not UTF-8, which `datasets` needs: rename "
                        f"it (e.g. convmv -r -f latin1 -t utf-8 --notest {directory})") from None


# ---- splits: datasets' default patterns, matched in memory ---------------------------------------

class _Matcher:
    """``datasets.data_files.resolve_pattern`` over a listing: a pattern's files, sorted, or [] if none."""

    def __init__(self, listing: Listing):
        self.by_folder = {folder.rstrip("/"): sorted(folder + name for name in names)
                          for folder, names in listing.folders.items()}
        self._all = "\n".join(path for paths in self.by_folder.values() for path in paths)
        self._sorted: list[str] | None = None
        self._resolved: dict[str, list[str]] = {}

    def resolve(self, pattern: str) -> list[str]:
        if pattern not in self._resolved:
            matches = re.compile(glob_translate(pattern)).match
            if pattern.endswith("/**"):
                # "<folders>/**" matches a file by its folder alone: test each folder once, with a stand-in name
                folders = [f for f in self.by_folder if matches(f"{f}/x" if f else "x")]
                found = [p for f in folders for p in self.by_folder[f]]
                if len(folders) > 1:
                    found.sort()
            else:
                literal = max((part.strip("/") for part in _MAGIC.split(pattern)), key=len)
                # one scan of every path tells whether any holds the pattern's literal part
                found = [p for p in self._paths() if literal in p and matches(p)] if literal in self._all else []
            self._resolved[pattern] = found
        return self._resolved[pattern]

    def _paths(self) -> list[str]:
        if self._sorted is None:
            self._sorted = sorted(path for paths in self.by_folder.values() for path in paths)
        return self._sorted


def split_files(listing: Listing) -> dict[str, list[str]] | None:
    """Split name -> its files (relative paths, in datasets' order) as ``datasets.data_files.get_data_patterns`` and
    ``DataFilesList.from_patterns`` find them; a file matching several patterns is listed once per pattern, as
    there. None for a sharded layout (``data/<split>-00000-of-00001.*``), which is left to datasets."""
    matcher = _Matcher(listing)
    if any(matcher.resolve(pattern.replace("{split}", "*")) for pattern in ALL_SPLIT_PATTERNS):
        return None
    for patterns_of_split in ALL_DEFAULT_PATTERNS:  # the first kind of layout that finds files wins
        found = {str(split): patterns for split, patterns in patterns_of_split.items()
                 if any(matcher.resolve(pattern) for pattern in patterns)}
        if found:
            return {split: [path for pattern in patterns for path in matcher.resolve(pattern)]
                    for split, patterns in found.items()}
    return {}


# ---- classes and rows ---------------------------------------------------------------------------

def _extension(name: str) -> str:
    """``os.path.splitext(name)[1].lower()`` for a name that does not start with a dot (hidden ones are skipped)."""
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


def needs_datasets(files: list[str]) -> bool:
    """Whether imagefolder would read these files other than as plain images: metadata files or zip archives."""
    lines = "\n" + "\n".join(files) + "\n"
    return ".zip\n" in lines.lower() or any(f"{sep}{name}\n" in lines for name in _METADATA_NAMES for sep in "/\n")


def _images(files: list[str], labelled: dict) -> tuple[list[str], list[str]]:
    """The files imagefolder reads as images (``a.png``, also ``a.png.gz``) and their folders; the folders of those
    whose last extension is an image's, the ones it takes class names from, go into ``labelled``."""
    paths, folders = [], []
    is_image = {}  # a name's last extension, as written -> whether it is an image's (the few a folder has)
    for path in files:
        folder, _, name = path.rpartition("/")
        dot = name.rfind(".")
        suffix = name[dot:] if dot > 0 else ""
        image = is_image.get(suffix)
        if image is None:
            image = is_image[suffix] = suffix.lower() in IMAGE_EXTENSIONS
        if image:
            labelled[folder] = None
        elif _extension(name[:dot]) not in IMAGE_EXTENSIONS:
            continue
        paths.append(path)
        folders.append(folder)
    return paths, folders


def folder_index(listing: Listing, parts: dict[str, list[str]], train_split: str, eval_split: str | None,
                 directory: str) -> FolderIndex:
    """The rows of ``train_split`` and ``eval_split`` (``+`` joins parts; ``parts`` maps each part to its files),
    labelled by class folder as imagefolder labels them: classes sorted, and only with two or more at one depth.
    DataError when there are no class folders, one class, or a class on one side only."""
    root_name = listing.root.rpartition("/")[2]

    def class_of(folder: str) -> str:  # the image's parent folder's name
        return folder.rpartition("/")[2] if folder else root_name

    labelled: dict[str, None] = {}
    images = {part: _images(files, labelled) for part, files in parts.items()}
    names = sorted({class_of(folder) for folder in labelled})
    classes = {part: {class_of(folder) for folder in set(folders)} for part, (_, folders) in images.items()}
    depths = {folder.count("/") + bool(folder) for folder in labelled}
    if len(names) < 2 or len(depths) != 1 or set(names) <= SPLIT_FOLDER_NAMES:
        raise no_classes_error(classes, directory)
    check_same_classes(classes, train_split, eval_split, directory)
    label_of = {name: label for label, name in enumerate(names)}
    rows = {}
    for split in (train_split, eval_split):
        if split is None:
            continue
        paths = [path for part in split.split("+") for path in images[part][0]]
        folders = [folder for part in split.split("+") for folder in images[part][1]]
        label_of_folder = {folder: label_of.get(class_of(folder)) for folder in set(folders)}
        stray = next((folder for folder, label in label_of_folder.items() if label is None), None)
        if stray is not None:  # an "a.png.gz" alone in its folder: imagefolder fails on it too
            raise DataError(f"cannot prepare image folder {directory}: the images in {stray or '.'} are in no "
                            f"class folder")
        rows[split] = pa.table({"path": pa.array([f"{listing.root}/{path}" for path in paths], pa.string()),
                                "label": pa.array([label_of_folder[folder] for folder in folders], pa.int64())})
    return FolderIndex(train_split, eval_split, names, rows)


def no_classes_error(classes: dict, directory: str) -> DataError:
    """What to say when imagefolder finds no class labels: one class folder, or images outside any."""
    found = set().union(*classes.values()) - SPLIT_FOLDER_NAMES
    if len(found) == 1:
        return DataError(f"{directory} has only one class ({found.pop()!r}): a classifier needs two class "
                         f"folders or more, as in train/<class>/ and val/<class>/")
    return DataError(f"{directory} has images but no class folders: put them in "
                     f"train/<class>/ and val/<class>/ (or test/<class>/), two classes or more")


def check_same_classes(classes: dict, train_split: str, eval_split: str | None, directory: str) -> None:
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


def image_path_dataset(rows: pa.Table, label_names: list[str], streaming: bool = False) -> Dataset | IterableDataset:
    """``rows`` ("path", "label") as ``{"image": {"path", "bytes": None}, "label"}``, undecoded, cast in Arrow at
    once (``from_dict`` encodes row by row, ``cast_column`` to a ClassLabel maps: seconds for 100k rows)."""
    labels = ClassLabel(names=label_names)
    # streamed: sharded with plain labels, named after; datasets deep-copies the features into every shard
    # (seconds for iNaturalist's 8,142 class names)
    features = Features({"image": Image(decode=False), "label": Value("int64") if streaming else labels})
    table = table_cast(pa.table({"image": rows.column("path"), "label": rows.column("label")}), features.arrow_schema)
    dataset = Dataset(InMemoryTable(table), info=DatasetInfo(features=features))
    if not streaming:
        return dataset
    return dataset.to_iterable_dataset(num_shards=stream_shards(len(dataset))).cast_column("label", labels)


def stream_shards(rows: int) -> int:
    """Shards of a streamed split: enough for DataLoader workers to share, none smaller than ~1k rows."""
    return max(1, min(64, rows // 1024))
