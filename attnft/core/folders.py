"""Which folders are attnft's own: the file names of an adapter and of an export, and the marker only attnft writes.

``--overwrite`` replaces, and ``adapters delete`` removes, only a folder of one of these kinds; and
nothing attnft writes goes inside one (a run, an evaluation JSON, an export) but its own files.
"""
from __future__ import annotations

import fnmatch
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from .errors import AdapterError, ConfigError, StoreError

PathLike = Union[str, os.PathLike]

# the files of an adapter folder, peft's names, in both formats (attnft's and peft's)
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
CARD_FILE = "README.md"
SIDECAR_FILE = "attnft.json"  # a peft adapter folder's: what attnft knows about it
# the files of an export folder: timm's hub layout, or what transformers' save_pretrained writes
EXPORT_WEIGHTS = "model.safetensors"
EXPORT_CONFIG = "config.json"
PROCESSOR_FILE = "preprocessor_config.json"


# what only attnft writes: the "format" of the JSON file that marks each kind of folder as attnft's own
EXPORT_FORMAT = "attnft-export"  # attnft.json of an export folder
CONFIG_MAX_BYTES = 64 << 20  # an adapter config lists every tensor: a few MB for the largest models


def read_config_text(path: PathLike) -> str:
    """The text of a JSON config attnft reads (an adapter's, a sidecar); AdapterError, before a byte is read, for
    one over :data:`CONFIG_MAX_BYTES` (a server would hold it in memory, whole, for nothing)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > CONFIG_MAX_BYTES:
            raise AdapterError(f"{path} is {size:,} bytes: an adapter's config is at most {CONFIG_MAX_BYTES >> 20} MB")
        return f.read(CONFIG_MAX_BYTES + 1).decode("utf-8")


@dataclass(frozen=True)
class Marker:
    """A JSON file whose ``"format"`` only attnft writes: file names alone are shared by hub downloads."""

    file: str
    format: str

    def found_in(self, folder: PathLike) -> bool:
        path = Path(folder) / self.file
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return False
        with open(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > CONFIG_MAX_BYTES:
                return False
            try:
                data = json.loads(f.read())
            except (ValueError, RecursionError, OSError):
                return False
        return isinstance(data, dict) and data.get("format") == self.format


@dataclass(frozen=True)
class FolderKind:
    """A kind of folder attnft writes, recognised by its files and its marker: ``--overwrite`` replaces only
    one of these and ``adapters delete`` removes only an adapter.

    A folder is of this kind when every entry in it is a regular file whose name matches one of
    ``files`` (fnmatch patterns), each of ``required`` matches at least one of them, and one of
    ``markers`` is there; an empty folder holds nothing to lose and may be replaced too (``empty_ok``).
    """

    noun: str  # "an adapter", for messages
    required: tuple[str, ...]
    files: tuple[str, ...]
    markers: tuple[Marker, ...]

    def holds(self, path: PathLike, *, empty_ok: bool = True) -> bool:
        """Whether ``path`` is a folder of this kind (or empty, with ``empty_ok``); follows a symlink to a folder."""
        try:
            entries = list(os.scandir(path))
        except OSError:
            return False
        if not entries:
            return empty_ok
        if not all(e.is_file(follow_symlinks=False) and _matches(e.name, self.files) for e in entries):
            return False
        names = [e.name for e in entries]
        if not all(any(fnmatch.fnmatchcase(n, pattern) for n in names) for pattern in self.required):
            return False
        return any(marker.found_in(path) for marker in self.markers)

    def own_files(self, path: PathLike) -> list[Path]:
        """The entries of folder ``path`` this kind writes: regular files with its names."""
        return [Path(e.path) for e in os.scandir(path) if e.is_file(follow_symlinks=False) and _matches(e.name, self.files)]


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


class FolderKinds:
    """Several kinds of folder under one noun: a folder is of it when one of them holds it. The adapter folders of
    every method family, each registered by its family (:func:`attnft.methods.register_method`): this layer knows
    none of them."""

    def __init__(self, noun: str):
        self.noun = noun
        self.kinds: list[FolderKind] = []

    def register(self, kind: FolderKind) -> None:
        self.kinds.append(kind)

    def holds(self, path: PathLike, *, empty_ok: bool = True) -> bool:
        """Whether ``path`` is a folder of one of the kinds (or empty, with ``empty_ok``)."""
        return any(kind.holds(path, empty_ok=empty_ok) for kind in self.kinds)

    def own_files(self, path: PathLike) -> list[Path]:
        """The entries of ``path`` that the kind holding it writes (nothing when none holds it)."""
        kind = next((k for k in self.kinds if k.holds(path, empty_ok=False)), None)
        return kind.own_files(path) if kind is not None else []

    @property
    def marker_files(self) -> set[str]:
        return {marker.file for kind in self.kinds for marker in kind.markers}


ADAPTER_FOLDER = FolderKinds("an adapter")  # every family's adapter folder, registered by the families


def register_adapter_folder(kind: FolderKind) -> None:
    """Make folders of ``kind`` adapters: ``--overwrite`` replaces one and ``adapters delete`` removes one."""
    ADAPTER_FOLDER.register(kind)


EXPORT_FOLDER = FolderKind(
    "an export", required=(EXPORT_CONFIG, "model*.safetensors*", SIDECAR_FILE),
    files=(EXPORT_CONFIG, "model*.safetensors", "model.safetensors.index.json", PROCESSOR_FILE, CARD_FILE, SIDECAR_FILE),
    markers=(Marker(SIDECAR_FILE, EXPORT_FORMAT),),
)
ATTNFT_FOLDERS = (ADAPTER_FOLDER, EXPORT_FOLDER)


def enclosing_attnft_folder(path: PathLike) -> Optional[tuple[Path, FolderKind]]:
    """The adapter or export folder that ``path`` is, or lies inside (the nearest), with its kind; None if none.

    Nothing attnft writes goes into one of these but its own files: a run, an evaluation JSON or
    an export there would change (or break) what the folder's config describes.
    """
    folder = Path(os.path.realpath(path))
    markers = {marker.file for marker in EXPORT_FOLDER.markers} | ADAPTER_FOLDER.marker_files
    for candidate in (folder, *folder.parents):
        if not any((candidate / name).is_file() for name in markers):
            continue  # cheap: every attnft folder holds one of its markers
        for kind in ATTNFT_FOLDERS:
            if kind.holds(candidate, empty_ok=False):
                return candidate, kind
    return None


def check_outside_attnft_folders(path: PathLike, what: str) -> None:
    """StoreError if ``path`` is, or lies inside, an adapter or export folder attnft wrote."""
    found = enclosing_attnft_folder(path)
    if found is not None:
        folder, kind = found
        where = "is" if folder == Path(os.path.realpath(path)) else "lies inside"
        raise StoreError(f"{what} {path} {where} {folder}, {kind.noun} attnft wrote: its files are the {kind.noun[3:]}'s own; "
                         "choose a path outside it")


def check_outside_store(path: PathLike, what: str, store_root: PathLike) -> None:
    """StoreError if ``path`` is, or lies inside, the adapter store at ``store_root`` (symlinks followed)."""
    root, target = Path(os.path.realpath(store_root)), Path(os.path.realpath(path))
    if target == root or root in target.parents:
        raise StoreError(f"{what} {path} {'is' if target == root else 'lies inside'} the adapter store {store_root}: "
                         "the store holds adapters only; choose a path outside it")




def check_outside_data(path: PathLike, what: str, data: Optional[PathLike], data_flag: str) -> None:
    """ConfigError if ``path`` is, or lies inside, the dataset folder ``data`` (symlinks followed; None: a dataset
    that is no local folder): what attnft writes there would be read as data the next time (a picture as an image of
    a new class, a run folder as one more)."""
    if data is not None:
        check_outside(path, what, data, f"the dataset folder {data} ({data_flag})",
                      "what attnft writes there would be read as data")


def check_outside(path: PathLike, what: str, folder: PathLike, named: str, why: str) -> None:
    """ConfigError if ``path`` is, or lies inside, ``folder`` (symlinks followed), ``named`` so, for ``why``."""
    root, target = Path(os.path.realpath(folder)), Path(os.path.realpath(path))
    if target == root or root in target.parents:
        raise ConfigError(f"{what} {path} {'is' if target == root else 'lies inside'} {named}: {why}; choose a path "
                          "outside it")
