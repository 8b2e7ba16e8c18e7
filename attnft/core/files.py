"""Files and folders that appear whole or not at all, and OS errors as one user-facing line.

A folder is written into a hidden temporary folder beside its target, fsynced, and renamed into
place (an atomic exchange when replacing one, Linux ``renameat2``); a file is written beside
itself and ``os.replace``d. A reader sees the old version or the new one, never a half-written
one. An OSError (full disk, permissions, read-only file system) becomes one StoreError line.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import re
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Optional, Union

from .errors import AdapterError, DiskFullError, StoreError

PathLike = Union[str, os.PathLike]

from .folders import (  # noqa: F401  (re-exported: the file names and folder kinds have their home in .folders)
    ADAPTER_FOLDER, ATTNFT_FOLDERS, CARD_FILE, CONFIG_FILE, EXPORT_CONFIG, EXPORT_FOLDER, EXPORT_FORMAT,
    EXPORT_WEIGHTS, PROCESSOR_FILE, SIDECAR_FILE, WEIGHTS_FILE, FolderKind, FolderKinds, Marker,
    check_outside, check_outside_attnft_folders, check_outside_data, check_outside_store, enclosing_attnft_folder,
)

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def write_directory_atomically(target: PathLike, write: Callable[[Path], None], *, kind: Union[FolderKind, FolderKinds],
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


def remove_directory_atomically(target: PathLike, *, kind: Union[FolderKind, FolderKinds], what: Optional[str] = None) -> None:
    """Delete folder ``target``, a folder of ``kind``, so that readers see it whole or gone: rename it hidden,
    then remove its files (only those ``kind`` writes) and the folder.

    Anything else is refused with one StoreError line and left as it was: a folder that is not of
    ``kind`` before the rename, or one that gained other entries before it (renamed back). A symlink is
    removed as a link (what it points to stays). The rename needs no free space, so this works on a
    full disk; an OSError becomes one StoreError line and ``target`` stays.
    """
    target = Path(target)
    what = what or f"adapter {target.name}"
    doing = f"deleting {what} from {target.parent}"
    if target.is_symlink():
        try:
            target.unlink()
        except OSError as e:
            raise io_error(e, doing) from None
        return
    if not kind.holds(target, empty_ok=False):
        raise StoreError(f"{target} is not {kind.noun} attnft wrote (no {kind.noun[3:]} of a known format, or it holds "
                         "other files or folders): nothing was deleted")
    trash = target.parent / f".del-{target.name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        _rename_noreplace(target, trash)
    except OSError as e:
        raise io_error(e, doing) from None
    if not kind.holds(trash, empty_ok=False):  # changed between the look and the rename: put it back untouched
        _rename_noreplace(trash, target)
        raise StoreError(f"{target} changed while being deleted (it now holds other files): nothing was deleted")
    for item in kind.own_files(trash):
        item.unlink(missing_ok=True)
    try:
        trash.rmdir()
    except OSError:
        pass  # a leftover is hidden, never listed, and cleared by the next write
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


def regular_files(source: Path) -> list[Path]:
    """The regular, non-hidden files of adapter folder ``source`` (what an import copies); StoreError on any symlink,
    AdapterError if it is no folder."""
    if source.is_symlink():
        raise StoreError(f"{source} is a symbolic link to {os.readlink(source)}: import the folder itself")
    if not source.is_dir():
        raise AdapterError(f"no adapter folder at {source}")
    files = []
    for item in sorted(source.iterdir()):
        if item.name.startswith("."):
            continue  # e.g. huggingface_hub's .cache; never part of an adapter
        if item.is_symlink():
            raise StoreError(f"{item} is a symbolic link: import copies regular files only; replace it with the file it points to")
        if stat.S_ISREG(item.lstat().st_mode):
            files.append(item)
    return files


def copy_regular_file(source: Path, target: Path) -> None:
    """Copy ``source``, refusing it if it became a symlink or something else since it was listed."""
    try:
        # no following a symlink swapped in since the listing, no blocking on a FIFO
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise io_error(e, f"reading {source}") from None
    with open(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise StoreError(f"{source} is not a regular file: import copies regular files only")
        with open(target, "xb") as dst:
            shutil.copyfileobj(src, dst)


def write_files_atomically(files: dict[Path, bytes], what: str) -> None:
    """Write every file of ``files`` (path -> content) or none: each is written beside itself and fsynced, and
    only once all are is each renamed into place; an OSError (full disk, permissions) removes what was written, leaves
    the old files as they were and becomes one StoreError line naming ``what`` and the file."""
    written = {}
    try:
        for path, content in files.items():
            check_replaceable_file(path, what)
            tmp = written[path] = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
        for path, tmp in written.items():
            os.replace(tmp, path)
    except OSError as e:
        raise io_error(e, f"writing {what} ({path.name}) to {path.parent}") from None
    finally:
        for tmp in written.values():
            remove_entry(tmp)


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


FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT})  # the errnos of a write that found no space (disk, quota)
FULL_DISK_REASONS = tuple(_IO_REASONS[number] for number in sorted(FULL_DISK))  # their words in io_error's lines


def io_error(error: OSError, doing: str) -> StoreError:
    """An OSError as one user-facing line: ``no space left on device writing adapter X to DIR``; a DiskFullError for
    a full disk or quota."""
    reason = _IO_REASONS.get(error.errno) or (error.strerror or str(error)).lower()
    return (DiskFullError if error.errno in FULL_DISK else StoreError)(f"{reason} {doing}")


def _os_error_inside(error: Exception) -> Optional[OSError]:
    """The OSError behind a safetensors write error, which reaches Python as text ("... (os error 28)")."""
    from safetensors import SafetensorError

    match = re.search(r"\(os error (\d+)\)", str(error)) if isinstance(error, SafetensorError) else None
    return OSError(int(match.group(1)), os.strerror(int(match.group(1)))) if match else None


def check_replaceable_folder(target: PathLike, overwrite: bool, kind: Union[FolderKind, FolderKinds]) -> None:
    """StoreError unless folder ``target`` is absent, or (with ``overwrite``) a folder of ``kind`` attnft wrote."""
    target = Path(target)
    found = enclosing_attnft_folder(target.parent)
    if found is not None:
        raise StoreError(f"{target} lies inside {found[0]}, {found[1].noun} attnft wrote: choose a path outside it")
    if target.is_symlink() and not target.exists():
        raise StoreError(f"{target} is a symbolic link to a missing {os.readlink(target)}: remove it, or choose another name")
    if not os.path.lexists(target):
        return
    if not overwrite:
        raise StoreError(f"{target} already exists: pass --overwrite to replace it")
    if not target.is_dir():
        raise StoreError(f"{target} is a file, not {kind.noun} folder: --overwrite replaces only {kind.noun} attnft wrote")
    if not kind.holds(target):
        raise StoreError(f"{target} is not {kind.noun} attnft wrote (it holds other files or folders, or lacks the "
                         f"marker attnft writes): --overwrite replaces only that; choose another path")


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
        raise StoreError(f"{path} is {entry_kind(mode)}, not a regular file: attnft writes {what} only to a new or "
                         "regular file")


def entry_kind(mode: int) -> str:
    """What a file-system entry of ``st_mode`` is, in words: ``a folder``, ``a FIFO``, ``a device``, ..."""
    return ("a regular file" if stat.S_ISREG(mode) else "a folder" if stat.S_ISDIR(mode) else "a symbolic link"
            if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device")


def why_not_a_file(path: PathLike) -> Optional[str]:
    """None if ``path`` is a regular file (through symlinks); else what it is instead, in words: ``does not exist``,
    ``is a device, not a regular file``, ... (a FIFO or device is never opened: reading it would block or never end)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist" if not os.path.lexists(path) else "is a symbolic link to a missing file"
    except OSError as e:
        return f"cannot be read ({(e.strerror or str(e)).lower()})"
    return None if stat.S_ISREG(mode) else f"is {entry_kind(mode)}, not a regular file"


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
