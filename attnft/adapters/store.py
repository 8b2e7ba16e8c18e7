"""A store: a folder of named adapters, one sub-folder each.

Names (:mod:`.names`) never reach outside the store. Hidden entries (``.tmp-*`` being written, ``.del-*`` being
deleted) are never listed; every write and delete is atomic (:func:`attnft.core.files.write_directory_atomically`),
and a failed one (full disk, permissions) is one StoreError line with the store as it was. Every write first clears
the hidden entries killed writers left behind (:meth:`AdapterStore.remove_leftovers`).

Adapters of every method family live side by side. Each call asks the folder's family once
(:func:`attnft.methods.method_of`); ``read``, ``config``, ``verify`` and ``load`` return that family's types.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from torch import nn

from ..methods.freeze.config import Adapter, AdapterConfig
from ..methods.freeze.snapshot import BaseSnapshot
from ..core.checks import check_type
from ..core.errors import AttnftError, DiskFullError, StoreError
from ..core.files import (ADAPTER_FOLDER, CONFIG_FILE, PathLike, copy_regular_file, nearest_existing, pid_alive,
                          regular_files, remove_directory_atomically, remove_entry, write_directory_atomically)
from ..methods.record import AdapterRecord
from .names import check_name, is_valid_name
from ..methods import METHODS, AdapterSummary, Method, method_of
from ..core.hub import hub_errors
from ..methods.freeze.policy import PolicyReport

if TYPE_CHECKING:
    from peft import PeftModel

    from ..methods.peft.sidecar import PeftAdapterInfo
    from ..methods.peft.model import PeftReport

STORE_ENV = "ATTNFT_STORE"
DEFAULT_STORE = "adapters"
# A hidden entry is cleared automatically only if its writer's pid is dead here AND nothing in it
# changed for this long. The pid alone is not enough: a store on a shared disk may be written from
# another machine or container, whose pids mean nothing here; a live writer touches its files.
STALE_AFTER_S = 60.0
_HIDDEN_ENTRY = re.compile(r"\.(?:tmp|del)-.+-(\d+)-[A-Za-z0-9_]+")


def default_store_root() -> Path:
    """``$ATTNFT_STORE`` or ``./adapters``."""
    return Path(os.environ.get(STORE_ENV) or DEFAULT_STORE)


class AdapterStore:
    """Named adapters of every method family under one root folder, one sub-folder each.

    Args:
        root: the store's folder (created on the first save); default ``$ATTNFT_STORE``, else ``./adapters``.
    """

    def __init__(self, root: Union[str, os.PathLike, None] = None):
        check_type(root, (str, os.PathLike, type(None)), "root", "a folder (str or os.PathLike) or None")
        self.root = Path(root) if root is not None else default_store_root()

    def __repr__(self) -> str:
        return f"AdapterStore({str(self.root)!r})"

    def path(self, name: str) -> Path:
        return self.root / check_name(name)

    def exists(self, name: str) -> bool:
        return (self.path(name) / CONFIG_FILE).is_file()

    def folder(self, name: str) -> Path:
        """The folder of stored adapter ``name``; StoreError if there is none."""
        path = self.path(name)
        self._check_root()
        if not path.is_dir():
            raise StoreError(f"no adapter named {name!r} in {self.root}")
        return path

    def _check_root(self) -> None:
        """StoreError if the root, or the nearest existing folder above it, is a file."""
        ancestor = nearest_existing(self.root)
        if ancestor.exists() and not ancestor.is_dir():
            problem = "is a file, not a folder" if ancestor == self.root else f"cannot be created under the file {ancestor}"
            raise StoreError(f"the store {self.root} {problem}: pass --store a folder (or set ${STORE_ENV})")

    def check_writable(self, name: str, overwrite: bool = False, needed_bytes: int = 0) -> Path:
        """Where adapter ``name`` would be saved, if saving it can work; else StoreError. Writes nothing.

        Call it before training, so that a run does not end in an error it could have found in
        a second. Checks that ``name`` is valid; that the store is a folder, or can be created,
        and can be written (permissions, read-only file system); that at least ``needed_bytes``
        (default: any) are free; and that the entry ``name`` is free, or an adapter and
        ``overwrite`` -- never a dangling symlink, a file or a folder that is not an adapter,
        which ``overwrite`` would destroy. :meth:`save`, :meth:`destination` and :meth:`import_folder` call it.
        """
        path = self.path(name)
        self._check_root()
        folder = nearest_existing(self.root)
        if not os.access(folder, os.W_OK | os.X_OK):
            read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
            raise StoreError(f"{'read-only file system' if read_only else 'permission denied'} writing adapter {name} to {self.root}")
        usage = shutil.disk_usage(folder)
        if usage.total == 0:  # /proc, /sys: a virtual file system holds no files of ours, whatever its permissions
            raise StoreError(f"the store {self.root} is on a virtual file system ({folder} holds no regular files): "
                             f"pass --store a folder on a disk (or set ${STORE_ENV})")
        free = usage.free
        if free < max(needed_bytes, 1):
            needed = f", {needed_bytes} needed" if needed_bytes else ""
            raise DiskFullError(f"no space left on device writing adapter {name} to {self.root} "
                                f"({free} bytes free{needed})")
        if path.is_symlink() and not path.exists():
            raise StoreError(
                f"{path} is a symbolic link to a missing {os.readlink(path)}: "
                f"remove it (attnft adapters delete {name}) or choose another name"
            )
        if os.path.lexists(path):
            if not self.exists(name):
                raise StoreError(f"{path} exists and is not an adapter: move it away or choose another name")
            if not overwrite:
                raise StoreError(f"an adapter named {name!r} exists in {self.root}: pass --overwrite to replace it")
        return path

    def method(self, name: str) -> Method:
        """The method family of adapter ``name`` (:data:`attnft.methods.METHODS`); StoreError if it is not stored."""
        return method_of(self.folder(name))

    def format_name(self, name: str) -> str:
        """The name of its format: ``"peft"`` (from a lora / ia3 policy) or ``"attnft"``."""
        return self.method(name).format_name

    # --- write ---

    def save(self, name: str, model: Union[nn.Module, "PeftModel"], report: Union[PolicyReport, "PeftReport"],
             base: Optional[BaseSnapshot] = None, record: Optional[AdapterRecord] = None, *, overwrite: bool = False,
             mode: str = "exact", delta_dtype: str = "float16") -> Path:
        """Save an adapter under ``name`` (atomically), in the format of the family that made ``report``.

        Args:
            name: the adapter's name: ``[A-Za-z0-9][A-Za-z0-9._-]*``, no ``..``.
            model: the trained model (for a peft method, the ``PeftModel``).
            report: what trained, as ``apply_policy``, ``apply_peft_policy`` or a family's ``apply`` reported it.
            base: for a freezing policy, the ``BaseSnapshot`` captured before training (peft's report holds it).
            record: what the adapter says about itself (default: the model's own, ``AdapterRecord.of(model)``).
            overwrite: replace an adapter of that name.
            mode: ``exact`` (trained values) or ``delta`` (trained minus base), attnft's format.
            delta_dtype: the dtype of a delta: ``float16`` or ``bfloat16``.

        Returns:
            The adapter's folder.

        Raises:
            StoreError: a bad name, an existing adapter without ``overwrite``, a store that cannot be written.
            AdapterError: a tensor that is NaN or inf.
        """
        return self.destination(name, method_of(report), overwrite).save(model, report, base, record, mode=mode,
                                                                         delta_dtype=delta_dtype)

    def destination(self, name: str, method: Method, overwrite: bool = False) -> "Destination":
        """Where adapter ``name`` will be saved, checked writable now (:meth:`check_writable`): a run checks before it
        trains and saves there after (:meth:`Destination.save`) without asking the store or the family again.

        Args:
            name: the adapter's name.
            method: the family whose format it is saved in (``parse_method(spec).method``).
            overwrite: replace an adapter of that name.

        Returns:
            A ``Destination``: ``store``, ``name``, ``path``, ``method``, ``overwrite``.

        Raises:
            StoreError: as :meth:`check_writable`.
        """
        return Destination(self, name, self.check_writable(name, overwrite), method, overwrite)

    def import_folder(self, source: Union[str, os.PathLike], name: str, *, overwrite: bool = False) -> Path:
        """Copy a verified adapter folder (e.g. downloaded from a hub) into the store as ``name``.

        Only its regular files are copied (hidden ones and sub-folders are left out); a symlink,
        the folder itself or any file in it, is refused: its content could be anything anywhere.
        """
        path = self.check_writable(name, overwrite)
        files = regular_files(Path(source))
        method = method_of(source)
        method.verify(source)  # refuse a broken folder before anything is written
        self._clean_stale()

        def write(folder: Path) -> None:
            for item in files:
                copy_regular_file(item, folder / item.name)
            method.verify(folder)  # the copy, not just the source

        write_directory_atomically(path, write, kind=ADAPTER_FOLDER, overwrite=overwrite)
        return path

    def delete(self, name: str) -> None:
        """Remove adapter ``name``: only a folder that is an adapter attnft wrote (its marker, its files and nothing
        else), and only its files; anything else is one StoreError line, untouched. A symlink in the store is
        removed as a link, what it points to stays."""
        path = self.path(name)
        if not path.is_symlink():
            path = self.folder(name)
        self._clean_stale()
        remove_directory_atomically(path, kind=ADAPTER_FOLDER)

    # --- a Hugging Face hub ---
    # ``hub`` is anything with HfApi's create_repo / upload_folder / snapshot_download (default: HfApi()).

    def push(self, name: str, repo_id: str, *, hub=None, private: Optional[bool] = None) -> str:
        """Upload adapter ``name`` (verified first) as the model repo ``repo_id``; the folder is the repo."""
        path = self.folder(name)
        method_of(path).verify(path)
        hub = hub or _hf_api()
        with hub_errors(f"hub repo {repo_id}"):
            hub.create_repo(repo_id, private=private, exist_ok=True)
            hub.upload_folder(repo_id=repo_id, folder_path=str(path), commit_message=f"attnft adapter {name}")
        return repo_id

    def pull(self, repo_id: str, name: str, *, revision: Optional[str] = None, hub=None, overwrite: bool = False) -> Path:
        """Download the adapter in hub repo ``repo_id`` and import it as ``name``, verified; nothing is kept if it fails."""
        self.check_writable(name, overwrite)
        hub = hub or _hf_api()
        with tempfile.TemporaryDirectory(prefix=".pull-") as download:
            with hub_errors(f"hub repo {repo_id}"):
                folder = hub.snapshot_download(
                    repo_id, revision=revision, local_dir=download, allow_patterns=sorted({f for method in METHODS.values() for f in method.files})
                )
            return self.import_folder(folder, name, overwrite=overwrite)

    # --- read ---

    def read(self, name: str) -> Union[Adapter, "PeftAdapterInfo"]:
        """attnft's format: the verified :class:`Adapter` with its tensors. peft's: its sidecar (no tensor read)."""
        path = self.folder(name)
        return method_of(path).read(path)

    def load(self, name: str, model: nn.Module, **load_kwargs) -> Union[nn.Module, "PeftModel"]:
        """Load adapter ``name`` onto ``model`` (the base it was trained on, at any input size); the module to call.

        attnft's format: writes the trained tensors into ``model`` in place and returns ``model`` (``load_kwargs`` as
        :func:`attnft.methods.freeze.load.load_adapter`). peft's format: wraps ``model`` (changed in place) and returns
        the **PeftModel** to call instead (``load_kwargs`` as :func:`attnft.methods.peft.files.load_peft_adapter`).

        Raises:
            StoreError: no adapter of that name.
            AdapterError: files that do not verify, or tensors that do not fit the model.
            BaseMismatchError: ``model`` is not the base the adapter was trained on.
        """
        path = self.folder(name)
        return method_of(path).load(model, path, **load_kwargs)

    def config(self, name: str) -> Union[AdapterConfig, "PeftAdapterInfo"]:
        """What ``name`` describes itself as: attnft's AdapterConfig, or a peft adapter's sidecar."""
        path = self.folder(name)
        return method_of(path).config(path)

    def verify(self, name: str) -> Union[AdapterConfig, "PeftAdapterInfo"]:
        """Check the files of ``name`` against its config (sizes, sha256, names, shapes, classes) and every value
        finite; AdapterError naming what is off."""
        path = self.folder(name)
        return method_of(path).verify(path)

    def names(self) -> list[str]:
        self._check_root()
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and is_valid_name(p.name))

    def list(self) -> list[AdapterSummary]:
        """Every adapter in the store, read from its config (cheap: no tensor is read)."""
        summaries = []
        for name in self.names():
            path = self.root / name
            try:
                summaries.append(method_of(path).summary(name, path))
            except AttnftError as e:
                summaries.append(AdapterSummary(name=name, path=path, error=str(e)))
        return summaries

    def show(self, name: str) -> dict:
        """The config of ``name`` plus where it lives and its file sizes."""
        path = self.folder(name)
        info = {"name": name, "path": str(path), "files": {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file()}}
        info.update(method_of(path).describe(path))
        return info

    def remove_leftovers(self, older_than_s: float = 0.0) -> list[Path]:
        """Remove hidden ``.tmp-*`` / ``.del-*`` entries left by killed writers: their pid is not alive here and
        nothing in them changed for ``older_than_s`` seconds. Folders, files and symlinks alike (a link, not
        its target). Every write calls it with :data:`STALE_AFTER_S`."""
        removed = []
        if not self.root.is_dir():
            return removed
        now = time.time()
        for entry in self.root.iterdir():
            match = _HIDDEN_ENTRY.fullmatch(entry.name)
            if match is None or pid_alive(int(match.group(1))):
                continue
            if now - _last_change(entry) < older_than_s:
                continue
            remove_entry(entry)
            removed.append(entry)
        return removed

    def _clean_stale(self) -> None:
        try:
            self.remove_leftovers(older_than_s=STALE_AFTER_S)
        except OSError:
            pass  # a courtesy to the store: it must never stop the write itself


@dataclass(frozen=True)
class Destination:
    """Where an adapter will be saved (:meth:`AdapterStore.destination`): its store, name and folder, checked
    writable once, and the family whose format it is written in. What changed since the check is still refused at
    the write, atomically: a name taken meanwhile, a full disk, lost permissions (one StoreError line)."""

    store: AdapterStore
    name: str
    path: Path
    method: Method
    overwrite: bool = False

    def save(self, model: Union[nn.Module, "PeftModel"], report: Union[PolicyReport, "PeftReport"],
             base: Optional[BaseSnapshot] = None, record: Optional[AdapterRecord] = None, *, mode: str = "exact",
             delta_dtype: str = "float16") -> Path:
        """Save the adapter here, as :meth:`AdapterStore.save` does once it checked; the adapter's folder."""
        self.store._clean_stale()
        self.method.save(self.path, model, report, base, record or AdapterRecord.of(model), overwrite=self.overwrite,
                         mode=mode, delta_dtype=delta_dtype, title=self.name)
        return self.path


def _hf_api():
    from huggingface_hub import HfApi

    return HfApi()


def _last_change(entry: Path) -> float:
    """The newest mtime of a hidden entry and what is directly in it (a writer updates the file it writes)."""
    times = [entry.lstat().st_mtime]
    if entry.is_dir() and not entry.is_symlink():
        for item in entry.iterdir():
            try:
                times.append(item.lstat().st_mtime)
            except FileNotFoundError:
                continue  # removed while we looked
    return max(times)


@dataclass
class FoundAdapter:
    """An adapter named by a store name or a folder: where it is, its format, what reading it gave."""

    path: Path
    method: Method
    adapter: Any  # attnft's: the verified Adapter with its tensors; peft's: its sidecar
    config: Any  # AdapterConfig or PeftAdapterInfo: model_name, input_size, data_config, num_classes

    def model(self, model_name: Optional[str] = None, checkpoint: Optional[str] = None) -> nn.Module:
        """The base (``model_name``, else the one the adapter names) at the adapter's input size, the adapter
        served on it: the model to evaluate (for peft, the PeftModel wrapping the base)."""
        from ..models import create_model

        base = create_model(model_name or self.config.model_name, checkpoint=checkpoint, img_size=self.config.input_size)
        return self.method.load(base, self.adapter)


def find_adapter(name_or_folder: str, store_root: Optional[PathLike] = None) -> FoundAdapter:
    """The adapter in folder ``name_or_folder``, else the one of that name in the store at ``store_root``.

    Args:
        name_or_folder: an adapter folder, or a name in the store.
        store_root: the store (default: ``$ATTNFT_STORE``, else ``./adapters``).

    Returns:
        A ``FoundAdapter``: ``path``, ``method``, ``adapter`` as read, ``config``; ``.model()`` builds the base with it.

    Raises:
        StoreError: no such adapter.
        AdapterError: files that do not verify.
    """
    path = Path(name_or_folder) if os.path.isdir(name_or_folder) else AdapterStore(store_root).folder(name_or_folder)
    method = method_of(path)
    adapter = method.read(path)
    return FoundAdapter(path, method, adapter, method.config(adapter))


__all__ = ["AdapterStore", "Destination", "FoundAdapter", "STALE_AFTER_S", "default_store_root", "find_adapter"]
