"""Files and folders that appear whole or not at all, and OS errors as one user-facing line.

A folder is written into a hidden temporary folder beside its target, fsynced, and renamed into
place (an atomic exchange when replacing one, Linux ``renameat2``); a file is written beside
itself and ``os.replace``d. A reader sees the old version or the new one, never a half-written
one. An OSError (full disk, permissions, read-only file system) becomes one StoreError line.
"""
from __future__ import annotations

import ctypes
import errno
import fnmatch
import hashlib
import os
import re
import secrets
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from .errors import StoreError

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


@dataclass(frozen=True)
class FolderKind:
    """A kind of folder attnft writes, recognised by its files: ``--overwrite`` replaces only one of these.

    A folder is of this kind when every entry in it is a regular file whose name matches one of
    ``files`` (fnmatch patterns) and each of ``required`` matches at least one of them; an empty
    folder holds nothing to lose and may be replaced too.
    """

    noun: str  # "an adapter", for messages
    required: tuple[str, ...]
    files: tuple[str, ...]

    def holds(self, path: PathLike) -> bool:
        """Whether ``path`` is a folder of this kind (or empty); follows a symlink to a folder."""
        try:
            entries = list(os.scandir(path))
        except OSError:
            return False
        if not all(e.is_file(follow_symlinks=False) and _matches(e.name, self.files) for e in entries):
            return False
        names = [e.name for e in entries]
        return not names or all(any(fnmatch.fnmatchcase(n, pattern) for n in names) for pattern in self.required)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


ADAPTER_FOLDER = FolderKind("an adapter", required=(CONFIG_FILE, WEIGHTS_FILE), files=(CONFIG_FILE, WEIGHTS_FILE, CARD_FILE, SIDECAR_FILE))
EXPORT_FOLDER = FolderKind(
    "an export", required=(EXPORT_CONFIG, "model*.safetensors*"),
    files=(EXPORT_CONFIG, "model*.safetensors", "model.safetensors.index.json", PROCESSOR_FILE, CARD_FILE),
)

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def write_directory_atomically(target: PathLike, write: Callable[[Path], None], *, kind: FolderKind,
                               overwrite: bool = False, what: Optional[str] = None) -> None:
    """Make folder ``target``, a folder of ``kind``, appear complete or not at all.

    ``write(folder)`` fills a hidden temporary folder beside ``target``; its files (made 0644) and
    the folder are fsynced, then it is renamed to ``target`` (refusing an existing one) or, with
    ``overwrite``, exchanged with it in one step, if it is a folder of ``kind`` (anything else is
    refused: a store, another adapter, a folder of the user's). Any failure removes the temporary folder and
    leaves ``target`` as it was; an OSError (full disk, permissions, read-only file system)
    becomes one StoreError line naming ``what`` (default ``adapter NAME``) and the folder. A crash
    leaves at most a hidden ``.tmp-*`` folder, which :meth:`attnft.adapters.store.AdapterStore.remove_leftovers` clears.
    """
    target = Path(target)
    doing = f"writing {what or f'adapter {target.name}'} to {target.parent}"
    check_replaceable_folder(target, overwrite, kind)
    ancestor = nearest_existing(target.parent)
    if not ancestor.is_dir():
        raise StoreError(f"cannot create {target.parent}: {ancestor} is a file, not a folder")
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-{os.getpid()}-", dir=target.parent))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        write(tmp)
        for item in tmp.iterdir():
            if item.is_file() and not item.is_symlink():
                # safetensors writes through a private temporary file (0600); the other files are 0644
                os.chmod(item, 0o644)
            _fsync(item)
        _fsync(tmp)
        if os.path.lexists(target):
            check_replaceable_folder(target, overwrite, kind)  # another writer may have been faster
            _exchange(tmp, target)  # tmp now holds the old entry (a symlink, if target was one)
        else:
            _rename_noreplace(tmp, target)
            tmp = None
        _fsync(target.parent)
    except OSError as e:
        raise io_error(e, doing) from None
    except Exception as e:
        os_error = _os_error_inside(e)
        if os_error is None:
            raise
        raise io_error(os_error, doing) from None
    finally:
        if tmp is not None:
            remove_entry(tmp)


def remove_directory_atomically(target: PathLike, *, what: Optional[str] = None) -> None:
    """Delete folder ``target`` so that readers see it whole or gone: rename it hidden, then remove it.

    A symlink is removed as a link (what it points to stays). The rename needs no free space,
    so this works on a full disk; an OSError becomes one StoreError line and ``target`` stays.
    """
    target = Path(target)
    trash = target.parent / f".del-{target.name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        _rename_noreplace(target, trash)
    except OSError as e:
        raise io_error(e, f"deleting {what or f'adapter {target.name}'} from {target.parent}") from None
    remove_entry(trash)  # a leftover is hidden, never listed, and cleared by the next write
    try:
        _fsync(target.parent)
    except OSError:
        pass  # the rename is done; the directory entry reaches the disk with the next sync


def write_text_atomically(path: PathLike, text: str, what: str) -> None:
    """Write ``path`` whole or not at all (temporary file, fsync, rename); an OSError (full disk,
    permissions) becomes one StoreError line naming ``what``, and no temporary file is left."""
    path = Path(path)
    check_replaceable_file(path, what)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        remove_entry(tmp)
        raise io_error(e, f"writing {what} to {path}") from None


def nearest_existing(path: PathLike) -> Path:
    """``path`` if it exists, else the nearest folder above it that does (what creating it would write into)."""
    path = Path(path)
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def remove_entry(path: Path) -> None:
    """Remove a file, a symlink (not what it points to) or a folder tree; errors ignored (best effort)."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


def folder_bytes(path: PathLike) -> int:
    """Bytes of the regular files directly in folder ``path`` (an adapter folder has no sub-folders)."""
    return sum(p.stat().st_size for p in Path(path).iterdir() if p.is_file())


def sha256_file(path: PathLike) -> str:
    """sha256 hex of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


_IO_REASONS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
}


def io_error(error: OSError, doing: str) -> StoreError:
    """An OSError as one user-facing line: ``no space left on device writing adapter X to DIR``."""
    reason = _IO_REASONS.get(error.errno) or (error.strerror or str(error)).lower()
    return StoreError(f"{reason} {doing}")


def _os_error_inside(error: Exception) -> Optional[OSError]:
    """The OSError behind a safetensors write error, which reaches Python as text ("... (os error 28)")."""
    from safetensors import SafetensorError

    match = re.search(r"\(os error (\d+)\)", str(error)) if isinstance(error, SafetensorError) else None
    return OSError(int(match.group(1)), os.strerror(int(match.group(1)))) if match else None


def check_replaceable_folder(target: PathLike, overwrite: bool, kind: FolderKind) -> None:
    """StoreError unless folder ``target`` is absent, or (with ``overwrite``) a folder of ``kind`` attnft wrote."""
    target = Path(target)
    if target.is_symlink() and not target.exists():
        raise StoreError(f"{target} is a symbolic link to a missing {os.readlink(target)}: remove it, or choose another name")
    if not os.path.lexists(target):
        return
    if not overwrite:
        raise StoreError(f"{target} already exists: pass --overwrite to replace it")
    if not target.is_dir():
        raise StoreError(f"{target} is a file, not {kind.noun} folder: --overwrite replaces only {kind.noun} attnft wrote")
    if not kind.holds(target):
        raise StoreError(f"{target} is not {kind.noun} attnft wrote (it holds other files or folders): "
                         f"--overwrite replaces only that; choose another path")


def check_replaceable_file(path: PathLike, what: str) -> None:
    """StoreError unless ``path`` is absent or a regular file: a device, FIFO, socket, folder or symbolic
    link is never replaced by a file attnft writes (as root, ``/dev/full`` would become a file)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise io_error(e, f"writing {what} to {path}") from None
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode)
                else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device")
        raise StoreError(f"{path} is {kind}, not a regular file: attnft writes {what} only to a new or regular file")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Linux renameat2; False where the kernel, libc or filesystem lacks it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), ctypes.c_uint(flags)) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    if err == errno.EEXIST:
        raise StoreError(f"{dst} already exists: pass --overwrite to replace it")
    raise OSError(err, os.strerror(err), str(dst))


def _rename_noreplace(src: Path, dst: Path) -> None:
    if not _renameat2(src, dst, _RENAME_NOREPLACE):
        if os.path.lexists(dst):
            raise StoreError(f"{dst} already exists: pass --overwrite to replace it")
        os.rename(src, dst)


def _exchange(src: Path, dst: Path) -> None:
    """Swap two folders atomically; without renameat2, move the old one aside first (dst briefly absent)."""
    if _renameat2(src, dst, _RENAME_EXCHANGE):
        return
    aside = Path(tempfile.mkdtemp(prefix=f".del-{dst.name}-{os.getpid()}-", dir=dst.parent))
    os.rename(dst, aside / "old")
    os.rename(src, dst)
    os.rename(aside / "old", src)
    aside.rmdir()


# a temporary entry and a run's lock name the pid of their writer: alive, they are in use
def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (someone else's counts: it cannot be signalled)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True
