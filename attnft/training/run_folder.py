"""The output dir of a run: the files it holds, who owns it, and its metrics log.

A run owns its output dir through a lock file (:class:`RunLock`), checks before anything long
that the folder can be written and holds no other run, and writes every file there as strict
JSON or YAML, whole or not at all.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
import stat
import time
from pathlib import Path
from typing import Optional

from ..core.errors import ConfigError
from .evaluate import strict_json
from ..core.files import check_replaceable_file, io_error, pid_alive, remove_entry, write_text_atomically
from .processes import on_main

# what a run writes in its output dir
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_FILE = re.compile(r"step_(\d+)\.pt")  # in CHECKPOINT_DIR; written as checkpoint_tmp_name(), then renamed
METRICS_FILE = "metrics.jsonl"
RUN_CONFIG_FILE = "config.yaml"
RESULT_FILE = "result.json"
LOCK_FILE = "attnft.lock"  # the pid and host of the run that owns the folder
LOCK_GRACE_S = 5.0  # a lock file without a pid yet is being written for this long at most
# the first line of every config.yaml a run writes: the marker that makes the folder an attnft run's
RUN_CONFIG_HEADER = "# the resolved configuration of this run; attnft finetune --recipe this file --overwrite repeats it"


def check_output_dir_usable(output_dir: Path) -> None:
    """ConfigError if ``output_dir`` cannot be a folder this run writes: a file is in the way, or no permission."""
    ancestor = output_dir
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        where = "is a file" if ancestor == output_dir else f"cannot be created: {ancestor} is a file"
        raise ConfigError(f"the output dir {output_dir} {where}: pass --output-dir a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"the output dir {output_dir} cannot be written (permission denied on {ancestor}): "
                          "pass --output-dir a folder you can write")
    for name in (RUN_CONFIG_FILE, METRICS_FILE, RESULT_FILE, LOCK_FILE):
        check_replaceable_file(output_dir / name, f"the run's {name}")  # a FIFO or device there is never replaced
    _check_checkpoint_dir(output_dir / CHECKPOINT_DIR)


def checkpoint_tmp_name(name: str) -> str:
    """The name a checkpoint ``name`` is written under before its rename (an interrupted save leaves it)."""
    return f".{name}.tmp"


def _is_checkpoint_name(name: str) -> bool:
    """``step_N.pt``, or the temporary name it is written under."""
    final = name[1:-len(".tmp")] if name.startswith(".") and name.endswith(".tmp") else name
    return bool(CHECKPOINT_FILE.fullmatch(final)) and name in (final, checkpoint_tmp_name(final))


def _check_checkpoint_dir(directory: Path) -> None:
    """ConfigError unless ``directory`` is absent or a folder (or a link to one) of regular files named as attnft
    names checkpoints: a fresh run removes them and a resumed one reads them, so nothing else may be there (a FIFO
    would hang the read, a user's file would be deleted)."""
    if not os.path.lexists(directory):
        return
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a folder of checkpoints: move it away or pass another --output-dir")
    try:
        entries = list(os.scandir(directory))
    except OSError as e:
        raise io_error(e, f"reading the checkpoints in {directory}") from None
    for entry in entries:
        if not (_is_checkpoint_name(entry.name) and entry.is_file(follow_symlinks=False)):
            kind = "a regular file" if entry.is_file(follow_symlinks=False) else "not a regular file"
            raise ConfigError(f"{directory} holds {entry.name} ({kind}), which is no checkpoint attnft wrote: "
                              "move it away or pass another --output-dir")


def is_run_folder(output_dir: Path) -> bool:
    """Whether ``output_dir`` holds a run attnft wrote: its config.yaml starts with :data:`RUN_CONFIG_HEADER`."""
    try:
        with open(output_dir / RUN_CONFIG_FILE, "rb") as f:
            return f.read(len(RUN_CONFIG_HEADER) + 1).decode("utf-8", "replace").rstrip("\n") == RUN_CONFIG_HEADER
    except OSError:
        return False


def run_folder_id(output_dir: Path) -> str:
    """The run folder an adapter was trained in, as its training record names it: a sha256 of the folder's real
    path, so that no path leaves the machine with the adapter (a comparison recognises its own adapter by it)."""
    return hashlib.sha256(os.path.realpath(output_dir).encode(errors="surrogateescape")).hexdigest()[:16]


def check_output_dir_free(output_dir: Path, overwrite: bool, resume: bool) -> None:
    """ConfigError if ``output_dir`` holds another run that neither --resume nor --overwrite takes on, or files named
    as a run's that no attnft run wrote (a user's config.yaml, metrics.jsonl or result.json), which nothing replaces."""
    checkpoints = output_dir / CHECKPOINT_DIR  # an empty one (a link to a roomier disk, say) holds no run
    used = [p for p in (output_dir / RUN_CONFIG_FILE, output_dir / METRICS_FILE, checkpoints, output_dir / RESULT_FILE)
            if p.exists() and not (p == checkpoints and p.is_dir() and not any(p.iterdir()))]
    if not used:
        return
    if not is_run_folder(output_dir):
        names = ", ".join(p.name for p in used if p != checkpoints)
        raise ConfigError(f"{output_dir} holds {names}, which no attnft run wrote (its config.yaml would start with "
                          f"attnft's header): attnft replaces only its own; move them away or pass another --output-dir")
    if not overwrite and not resume:
        raise ConfigError(f"{output_dir} holds another run ({used[0].name}): pass --resume to continue it, "
                          f"--overwrite to replace it, or --output-dir")


def start_output_dir(output_dir: Path, config: dict, resumed_step: Optional[int]) -> None:
    """Make ``output_dir`` this run's: a fresh run (``resumed_step`` None) drops an earlier run's
    checkpoints and logs, a resumed one what was logged after its checkpoint; config.yaml is written
    from ``config`` (the run's ``FinetuneConfig.to_dict``)."""
    import yaml

    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        if resumed_step is None:  # an earlier run's checkpoints, and nothing else (checked before the run)
            checkpoints = output_dir / CHECKPOINT_DIR
            if checkpoints.is_dir():  # a link to a folder stays a link, emptied
                for entry in checkpoints.iterdir():
                    if _is_checkpoint_name(entry.name) and entry.is_file() and not entry.is_symlink():
                        entry.unlink()
                if not checkpoints.is_symlink():
                    checkpoints.rmdir()
            for stale in (METRICS_FILE, RESULT_FILE):
                (output_dir / stale).unlink(missing_ok=True)
        else:
            MetricsLog(output_dir / METRICS_FILE).truncate_after(resumed_step)
    except OSError as e:
        raise io_error(e, f"preparing the output dir {output_dir}") from None
    text = RUN_CONFIG_HEADER + "\n" + yaml.safe_dump(config, sort_keys=False)
    write_text_atomically(output_dir / RUN_CONFIG_FILE, text, f"the run's {RUN_CONFIG_FILE}")


# --- owning the output dir -------------------------------------------------------------------


class RunLock:
    """A run owns its output dir: ``attnft.lock`` there holds the pid and host of the run, created
    with O_EXCL once the checks passed and removed when the run ends, however it ends. A second run
    on the same folder is refused; a lock whose process is dead (SIGKILL, a crash) is taken over.
    Under DDP the main process alone holds it. A subclass names another lock file, what holds it and what else the
    user can do (:class:`attnft.compare.run.CompareLock`)."""

    FILE = LOCK_FILE
    HOLDER = "another run"
    ELSE = "or pass another --output-dir"

    def __init__(self, output_dir: Path, accelerator=None):
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / self.FILE
        self.accelerator = accelerator
        self.held = False

    @classmethod
    def check_free(cls, output_dir: Path) -> None:
        """ConfigError if another live run holds ``output_dir``; writes nothing."""
        owner = _lock_owner(Path(output_dir) / cls.FILE)
        if owner is not None:
            raise ConfigError(cls._in_use(Path(output_dir), owner))

    def __enter__(self) -> "RunLock":
        if self.accelerator is None:
            self._acquire()
        else:
            on_main(self.accelerator, self._acquire)
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _acquire(self) -> None:
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            for _ in range(3):
                try:
                    fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    owner = _lock_owner(self.path)
                    if owner is not None:
                        raise ConfigError(self._in_use(self.output_dir, owner)) from None
                    remove_entry(self.path)  # stale: its run is gone
                    continue
                try:
                    with os.fdopen(fd, "w") as f:
                        f.write(f"{os.getpid()} {socket.gethostname()}\n")
                except OSError:
                    remove_entry(self.path)  # an empty lock (a full disk) would hold the folder for LOCK_GRACE_S
                    raise
                self.held = True
                return
        except OSError as e:
            raise io_error(e, f"taking the output dir {self.output_dir} (its {self.FILE})") from None
        raise ConfigError(f"{self.output_dir}: {self.HOLDER} keeps taking its {self.FILE}; pass another --output-dir")

    def release(self) -> None:
        if self.held:
            self.held = False
            remove_entry(self.path)

    @classmethod
    def _in_use(cls, output_dir: Path, owner: tuple[int, str]) -> str:
        pid, host = owner
        who = f"pid {pid}" + ("" if host == socket.gethostname() else f" on {host}")
        return (f"{output_dir} is in use by {cls.HOLDER} ({who}, see {output_dir / cls.FILE}): wait for it to end, "
                f"{cls.ELSE}")


def _lock_owner(path: Path) -> Optional[tuple[int, str]]:
    """(pid, host) of the live run that holds the lock ``path``; None if there is none or it is stale."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        text = ""
    fields = text.split()
    if not fields or not fields[0].isdigit():
        # being written this instant, or garbage: only a fresh one counts as held
        try:
            young = time.time() - path.stat().st_mtime < LOCK_GRACE_S
        except OSError:
            return None
        return (0, "?") if young else None
    pid, host = int(fields[0]), fields[1] if len(fields) > 1 else socket.gethostname()
    if host != socket.gethostname():
        return pid, host  # another machine's pid cannot be checked from here: held
    if pid == os.getpid():
        return None  # an earlier run in this very process (a notebook, the tests) that cannot be running now
    return (pid, host) if pid_alive(pid) else None




# --- metrics ---------------------------------------------------------------------------------


class MetricsLog:
    """metrics.jsonl: one strict-JSON object per line (NaN and inf written as null), appended and flushed
    as training goes. With ``tracker`` (the Accelerator) every numeric field also goes to its trackers,
    at the record's step."""

    def __init__(self, path: Path, enabled: bool = True, tracker=None):
        self.path = path
        self.enabled = enabled
        self.tracker = tracker

    def write(self, record: dict) -> None:
        if self.tracker is not None:
            numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                       and k not in ("step", "epoch") and math.isfinite(v)}
            self.tracker.log(numbers, step=record["step"])
        if self.enabled:
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(strict_json({**record, "time": round(time.time(), 3)}) + "\n")
            except OSError as e:
                raise io_error(e, f"writing {self.path}") from None

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        """Drop what a killed run logged after its last checkpoint; the resumed run logs it again."""
        kept = [r for r in self.read() if r["step"] <= step and not r.get("final")]
        write_text_atomically(self.path, "".join(strict_json(r) + "\n" for r in kept), self.path.name)
