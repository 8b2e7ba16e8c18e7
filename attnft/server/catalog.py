"""What the store holds now, as the server sees it: one :class:`TaskEntry` per adapter, kept current.

The store writes an adapter folder atomically (a hidden folder renamed into place), so a new
or overwritten adapter is a new folder: its inode and its files' mtimes change. Every lookup
stats the folder, its config and its weights once (a few microseconds) and re-reads the config when
they changed, so a store write is seen by the next request, without a restart and without a
watcher thread. Only the family and the config are read here (no tensor), once per version: the entry
carries them (:class:`attnft.methods.AdapterFolder`), and the pager loads the weights against them.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..core.errors import AttnftError, ConfigError, StoreError
from ..methods import METHODS, AdapterFolder, Method, method_of
from ..adapters.names import check_name, is_valid_name
from ..core.folders import ADAPTER_FOLDER

# the files whose change means an adapter changed, every family's (a file another family writes is absent and stays so)
_WATCHED = tuple(dict.fromkeys(name for method in METHODS.values() for name in method.watched))

Signature = tuple  # (inode, mtime_ns, size) of the folder, its config and its weights


@dataclass(frozen=True)
class BaseKey:
    """What one backbone serves: adapters of one base model at one input size, of one method family, in one of its
    serving groups (peft: one peft method, as one PeftModel holds adapters of one type)."""

    model_name: str
    input_size: int
    method: Method  # the family (attnft.methods.METHODS) whose multi-task model serves them
    group: str = ""  # Method.serving_group: what else they share on one base

    def describe(self) -> str:
        kind = " ".join(filter(None, (self.method.format_name, self.group)))
        return f"{self.model_name} at {self.input_size} px ({kind} adapters)"


@dataclass(frozen=True)
class TaskEntry:
    """One stored adapter, as its config describes it; ``version`` grows each time the folder changes. ``folder``
    holds what was read of this version (its family and config), which the loaders take instead of reading again."""

    name: str
    path: Path
    version: int
    signature: Signature
    base: Optional[BaseKey] = None
    num_classes: int = 0
    label_names: Optional[tuple] = None
    data_config: Optional[dict] = None
    weights_sha256: str = ""
    trained_params: int = 0
    format_name: str = ""  # its format as answers name it: "attnft", "peft-lora"
    folder: Optional[AdapterFolder] = None  # its family and config as read (None with an error)
    error: Optional[str] = None  # why it cannot be served (its config cannot be read)

    def label(self, index: int) -> str:
        names = self.label_names
        return str(names[index]) if names and index < len(names) else str(index)


@dataclass(frozen=True)
class Found:
    """A task's folder as one look found it (:meth:`StoreCatalog.find`): its signature, and the entry read from that
    very signature if the catalog keeps one (else :meth:`StoreCatalog.read` reads it)."""

    name: str
    path: Path
    signature: Signature
    entry: Optional[TaskEntry]


class UnknownTask(AttnftError):
    """A request named a task the store does not hold (or that --tasks leaves out)."""


class StoreUnavailable(StoreError):
    """The store's root is a file now (or lies under one): no task can be served until it is a folder again."""


class StoreCatalog:
    """The adapters of ``store`` that are served (``names``: only these; None: every one, new ones too)."""

    def __init__(self, store, names: Optional[list[str]] = None, *, on_change: Optional[Callable[[str], None]] = None):
        self.store = store
        self.allowed = None if names is None else [check_name(name) for name in names]
        self.on_change = on_change  # called with a task's name when its folder changed or went away
        self._entries: dict[str, TaskEntry] = {}
        self._lock = threading.Lock()
        self._next_version = 1

    def refresh(self) -> list[TaskEntry]:
        """Every served entry, re-read where the store changed (lists the store: for ``GET /v1/tasks``)."""
        self._check_store()
        names = self.allowed if self.allowed is not None else self.store.names()
        for gone in set(self._entries) - set(names):
            self._forget(gone)
        entries = []
        for name in names:
            try:
                entries.append(self.get(name))
            except UnknownTask:
                continue
        return entries

    def check_start(self) -> list[TaskEntry]:
        """The entries to serve at start-up; ConfigError when --tasks names a missing adapter or there is none."""
        try:
            entries = self.refresh()
        except StoreError as e:
            raise ConfigError(str(e)) from None
        if self.allowed is not None:
            missing = [name for name in self.allowed if name not in {e.name for e in entries}]
            if missing:
                raise ConfigError(f"--tasks names {', '.join(missing)}, which {self.store.root} does not hold: "
                                  "attnft adapters list shows what it holds")
        if not entries:
            raise ConfigError(f"no adapters in {self.store.root}: train one (attnft finetune) or pass --store DIR")
        return entries

    def get(self, name: str) -> TaskEntry:
        """The current entry of task ``name``; UnknownTask if it is not served, StoreUnavailable if no task can be."""
        return self.read(self.find(name))

    def find(self, name: str) -> Found:
        """Task ``name``'s folder as it is now, and the entry kept for it if that entry was read from it (one look
        at the folder: a few stats, nothing read); UnknownTask, StoreUnavailable as :meth:`get`."""
        path = self._path(name)
        signature = _signature(path)
        if signature is None:
            self._check_store()  # the entries are kept: a store put back as it was serves them as they were
            self._forget(name)
            raise UnknownTask(self._unknown(name))
        entry = self._entries.get(name)
        return Found(name, path, signature, entry if entry is not None and entry.signature == signature else None)

    def read(self, found: Found) -> TaskEntry:
        """The entry of the folder :meth:`find` found: the one kept, else its config read now."""
        return found.entry if found.entry is not None else self._reread(found.name, found.path, found.signature)

    def current(self, name: str) -> Optional[TaskEntry]:
        """The entry last seen for ``name`` (no stat), or None."""
        return self._entries.get(name)

    def unchanged(self, entry: TaskEntry) -> bool:
        """Whether ``entry``'s folder is still the one it was read from."""
        return _signature(entry.path) == entry.signature

    def _path(self, name: str) -> Path:
        if not is_valid_name(name) or (self.allowed is not None and name not in self.allowed):
            raise UnknownTask(self._unknown(name))
        return self.store.path(name)  # a valid name is one folder directly in the store

    def _reread(self, name: str, path: Path, signature: Signature) -> TaskEntry:
        entry = _read_entry(name, path, signature)
        with self._lock:
            previous = self._entries.get(name)
            if previous is not None and previous.signature == signature:
                return previous  # another thread read the same folder first
            entry = _with_version(entry, self._next_version)
            self._next_version += 1
            self._entries[name] = entry
        if previous is not None and self.on_change is not None:
            self.on_change(name)
        return entry

    def _check_store(self) -> None:
        """StoreUnavailable if the store's root is a file, or under one (a few stats: no listing)."""
        if self.store.root.is_dir():
            return
        try:
            self.store.names()  # StoreError for a file; [] at once for a root merely missing (its tasks are gone)
        except StoreError as e:
            raise StoreUnavailable(str(e)) from None

    def _forget(self, name: str) -> None:
        with self._lock:
            gone = self._entries.pop(name, None)
        if gone is not None and self.on_change is not None:
            self.on_change(name)

    def _unknown(self, name: str) -> str:
        served = sorted(self._entries) if self.allowed is None else self.allowed
        listed = ", ".join(served[:20]) + (f" and {len(served) - 20} more" if len(served) > 20 else "")
        return f"unknown task {str(name)[:80]!r}: served tasks are {listed or 'none'}"


def _signature(path: Path) -> Optional[Signature]:
    """The identity of an adapter folder now; None if it is not an adapter folder (gone, not one, a symlink loop,
    unreadable, or a link out of the store: served only as it would be imported, from the store itself)."""
    if path.is_symlink() and not _inside(path, path.parent):
        return None  # as import refuses links: what one points to out of the store could be anything anywhere
    try:
        parts = [os.stat(path)]
    except OSError:  # FileNotFoundError, NotADirectoryError, ELOOP, EACCES, ...
        return None
    for name in _WATCHED:
        try:
            parts.append(os.stat(path / name))
        except OSError:
            parts.append(None)  # served as an error: the config says what is missing
    if not any(part for name, part in zip(_WATCHED, parts[1:]) if name in ADAPTER_FOLDER.marker_files):
        return None  # no config of any family: not an adapter folder
    return tuple(s and (s.st_ino, s.st_mtime_ns, s.st_size) for s in parts)


def _inside(link: Path, root: Path) -> bool:
    try:
        return link.resolve(strict=True).parent == root.resolve(strict=True)
    except (OSError, RuntimeError):  # a loop, a missing target
        return False


def _read_entry(name: str, path: Path, signature: Signature) -> TaskEntry:
    """The entry of the adapter folder ``path`` from its config alone; an entry with ``error`` if it cannot be read."""
    try:
        folder = method_of(path).open(path)  # its family, found once, and its config, read once
        method, config = folder.method, folder.config
        base = BaseKey(config.model_name, int(config.input_size), method, method.serving_group(config))
        return TaskEntry(
            name, path, 0, signature, base=base, num_classes=int(config.num_classes or 0),
            label_names=tuple(config.label_names) if config.label_names else None,
            data_config=dict(config.data_config), weights_sha256=config.weights_sha256,
            trained_params=int(config.trained_params or 0), format_name=method.format_label(config), folder=folder,
        )
    except AttnftError as e:
        return TaskEntry(name, path, 0, signature, error=" ".join(str(e).split()))


def _with_version(entry: TaskEntry, version: int) -> TaskEntry:
    return TaskEntry(**{**entry.__dict__, "version": version})
