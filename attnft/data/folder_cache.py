"""An image folder's index kept between runs, and trusted only for the listing it was made from.

One Arrow file per folder, ``image-folders/<sha256 of the folder's real path>.arrow`` under ``$ATTNFT_CACHE_DIR``,
else ``$XDG_CACHE_HOME/attnft``, else ``~/.cache/attnft``; never inside the image folder. It holds one request's
rows (absolute image path, label, split) and class names, stored with the key they were made under: a sha256 of
the listing (every file's path: what the rows are made from), the split names asked for, the version of
``datasets`` whose rules split the folder, and this file's format. It is read only under the same key, so an
added, removed or renamed file, or another request, re-indexes the folder and replaces the entry; an image
edited in place changes no row, and keeps it. Entries are written
whole (a temporary file renamed over the old one); a cache that cannot be written is skipped, one that cannot be
read is rebuilt.
"""
import hashlib
import json
import logging
import os
from pathlib import Path

import datasets
import pyarrow as pa

from ..core.files import remove_entry
from .folders import FolderIndex, Listing

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "ATTNFT_CACHE_DIR"
# bump when what an entry holds, or how a folder is read, changes: old entries are then re-indexed
FORMAT_VERSION = 2  # 2: the listing's key holds the names alone
_METADATA_KEY = b"attnft"


def cache_dir() -> Path:
    """attnft's cache folder (not created here)."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "attnft"


def entry_path(root: str) -> Path:
    """Where the index of the folder at real path ``root`` is kept."""
    name = hashlib.sha256(root.encode(errors="surrogateescape")).hexdigest()[:32]
    return cache_dir() / "image-folders" / f"{name}.arrow"


def _key(listing: Listing, train_split, eval_split) -> str:
    request = json.dumps([FORMAT_VERSION, datasets.__version__, train_split, eval_split, listing.key])
    return hashlib.sha256(request.encode()).hexdigest()


def read(listing: Listing, train_split, eval_split) -> FolderIndex | None:
    """The cached index of ``listing``'s folder for this request, or None if there is none made from this listing."""
    path = entry_path(listing.root)
    try:
        with pa.OSFile(str(path)) as file:
            table = pa.ipc.open_file(file).read_all()
        meta = json.loads(table.schema.metadata[_METADATA_KEY])
        if meta["key"] != _key(listing, train_split, eval_split):
            return None
        rows, start = {}, 0
        for split, count in meta["counts"]:
            rows[split] = table.slice(start, count).select(["path", "label"])
            start += count
        index = FolderIndex(meta["train_split"], meta["eval_split"], meta["label_names"], rows)
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException, ValueError, KeyError, TypeError) as error:  # torn or foreign: re-index
        logger.debug("ignoring the cached index %s: %s", path, error)
        return None
    logger.info("index of %s read from the cache (%s)", listing.root, path)
    return index


def write(listing: Listing, train_split, eval_split, index: FolderIndex) -> None:
    """Keep ``index`` for the next run; best effort (a read-only or full cache is skipped)."""
    path = entry_path(listing.root)
    splits = [split for split in (index.train_split, index.eval_split) if split]
    meta = {"key": _key(listing, train_split, eval_split), "train_split": index.train_split,
            "eval_split": index.eval_split, "label_names": index.label_names,
            "counts": [[split, index.rows[split].num_rows] for split in splits]}
    table = pa.concat_tables([index.rows[split] for split in splits])
    table = table.replace_schema_metadata({_METADATA_KEY: json.dumps(meta).encode()})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(tmp), "wb") as file, pa.ipc.new_file(file, table.schema) as writer:
            writer.write_table(table)
        os.replace(tmp, path)
    except OSError as error:
        logger.debug("not caching the index of %s in %s: %s", listing.root, path, error)
        remove_entry(tmp)
        return
    logger.info("indexed %s: %d images, cached in %s", listing.root, table.num_rows, path)
