"""The final runs: each policy's chosen settings trained on the whole training split and scored on the
evaluation split, once per seed, each an ``attnft finetune --recipe`` in its own process.

Its own process gives each run its own peak memory (the child's resident set, its ``VmHWM``) and
wall time. A run that finished (its ``result.json`` and the measurement beside it) from the same recipe is read
back, not run again, so a comparison killed in this phase resumes here too; one of other settings is refused, or
with ``--overwrite`` run again.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from ..core.errors import AttnftError, ConfigError, DiskFullError
from ..core.files import FULL_DISK_REASONS, remove_entry, write_text_atomically
from ..core.lifetime import child_env
from ..training.config import FinetuneConfig
from ..training.run_folder import METRICS_FILE, RESULT_FILE, RunLock, is_run_folder
from .study import NOT_LEARNED, Settings, settings_of

MEASURED_FILE = "compare_run.json"  # beside result.json: what the comparison measured of the run


@dataclass
class FinalRun:
    """One final run as the report needs it."""

    seed: int
    top1: float
    lr: float
    trainable_params: int
    total_params: int
    adapter_bytes: int
    full_checkpoint_bytes: int
    step_s: Optional[float]  # median seconds per optimizer step, from the run's images/s
    peak_rss_mb: float
    wall_s: float
    adapter: str  # the adapter's name in its store
    store: str


def final_config(ft: FinetuneConfig, policy: str, settings: Settings, seed: int, run_dir: Path, store: Path,
                 name: str, overwrite: bool) -> FinetuneConfig:
    """The config of one final run (its recipe)."""
    return dataclasses.replace(ft, policy=policy, lr=settings.lr, weight_decay=settings.weight_decay, seed=seed,
                               search_holdout=None, output_dir=str(run_dir), store=str(store), name=name,
                               overwrite=overwrite, progress=False)


def is_finished(run_dir: Path) -> bool:
    return (run_dir / MEASURED_FILE).is_file() and (run_dir / RESULT_FILE).is_file()


def run_final(ft: FinetuneConfig, policy: str, settings: Settings, seed: int, run_dir: Path, store: Path,
              name: str, overwrite: bool) -> FinalRun:
    """The final run of ``policy`` with ``settings`` and ``seed`` in ``run_dir``: read back if it finished from the
    same recipe; one of other settings is refused (ConfigError), or with ``overwrite`` run again."""
    cfg = final_config(ft, policy, settings, seed, run_dir, store, name, overwrite)
    recipe = run_dir.with_suffix(".yaml")
    measured = run_dir / MEASURED_FILE
    if is_finished(run_dir) and same_recipe(run_dir, cfg):
        return FinalRun(**json.loads(measured.read_text()))
    if run_dir.exists() and (is_run_folder(run_dir) or not any(run_dir.iterdir())):
        RunLock.check_free(run_dir)  # a run still running (its comparison's lock taken over) is never removed
        remove_entry(run_dir)  # a run of ours killed before it ended, or of other settings: run it from the start
    recipe.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(recipe, yaml.safe_dump(cfg.to_dict(), sort_keys=False), f"the recipe of {run_dir.name}")
    log_path = run_dir.with_suffix(".log")
    start = time.perf_counter()
    with open(log_path, "w") as log:
        child = subprocess.Popen([sys.executable, "-m", "attnft", "finetune", "--recipe", str(recipe)],
                                 stdout=log, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=child_env(),
                                 text=True, errors="replace")
        said = _CopiedLines(child.stderr, log)  # kept here too: a full disk under the log loses no error line
        peak_kb = _watch_peak_rss(child)
        said.join()
    wall = time.perf_counter() - start
    if child.returncode != 0:
        last = said.lines[-1] if said.lines else _last_line(log_path)
        full = any(reason in last.lower() for reason in FULL_DISK_REASONS)
        raise (DiskFullError if full else AttnftError)(
            f"the final run of {policy} (seed {seed}) failed: {last} (its log: {log_path})")
    result = json.loads((run_dir / RESULT_FILE).read_text())
    run = FinalRun(seed=seed, top1=result["accuracy_after"], lr=_lr_of(run_dir),
                   trainable_params=result["trainable_params"], total_params=result["total_params"],
                   adapter_bytes=result["adapter_bytes"], full_checkpoint_bytes=result["full_checkpoint_bytes"],
                   step_s=_step_seconds(run_dir, cfg.batch_size * cfg.grad_accum), peak_rss_mb=peak_kb / 1024,
                   wall_s=round(wall, 2), adapter=name, store=str(store))
    write_text_atomically(measured, json.dumps(dataclasses.asdict(run), indent=2) + "\n", MEASURED_FILE)
    return run


def same_recipe(run_dir: Path, cfg: FinetuneConfig, also_ignore: frozenset = frozenset()) -> bool:
    """Whether the finished final run in ``run_dir`` was trained from ``cfg``'s recipe (:func:`_changed_settings`);
    one that was not is refused, ConfigError, unless ``cfg.overwrite`` lets it be run again."""
    changed = _changed_settings(run_dir.with_suffix(".yaml"), cfg, also_ignore)
    if changed and not cfg.overwrite:
        raise ConfigError(f"the final run of {cfg.policy} (seed {cfg.seed}) in {run_dir} was trained with other "
                          f"settings ({changed}): pass --overwrite to train it again and replace its adapter {cfg.name}")
    return not changed


def _changed_settings(recipe: Path, cfg: FinetuneConfig, also_ignore: frozenset = frozenset()) -> str:
    """What ``cfg`` sets otherwise than the recipe a finished final run was trained from, in a few words ("" when
    nothing). Not compared: what does not change what a run learns or is scored on (:data:`.study.NOT_LEARNED`),
    ``also_ignore``, and a field the recipe predates; paths as absolute paths."""
    try:
        held = yaml.safe_load(recipe.read_text())
    except (OSError, yaml.YAMLError):
        held = None
    if not isinstance(held, dict):
        return f"its recipe {recipe.name} is missing or unreadable"
    held, wanted = (settings_of(values, NOT_LEARNED | also_ignore) for values in (held, cfg.to_dict()))
    keys = [k for k in wanted if k in held and held[k] != wanted[k]]
    return ", ".join(f"{k} {held[k]!r}, now {wanted[k]!r}" for k in keys[:3]) + (" ..." if len(keys) > 3 else "")


class _CopiedLines(threading.Thread):
    """The lines of a child's pipe, copied to the file ``log`` as they come (unbuffered: a write that fails, its disk
    full, is left out and nothing waits to be flushed) and the last of them kept (``lines``), until the child closes
    it."""

    def __init__(self, pipe, log):
        super().__init__(daemon=True)
        self.pipe, self.fd, self.lines = pipe, log.fileno(), collections.deque(maxlen=20)
        self.start()

    def run(self) -> None:
        for line in self.pipe:
            if line.strip():
                self.lines.append(line.strip().removeprefix("attnft: error: "))
            try:
                os.write(self.fd, line.encode())
            except OSError:
                pass


def _last_line(log_path: Path) -> str:
    try:
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1] if lines else "no output"


def _watch_peak_rss(child: subprocess.Popen, every_s: float = 0.1) -> int:
    """The child's peak resident set (KiB) until it exits: its ``VmHWM``, read as it runs.

    Not ``wait4``'s ``ru_maxrss``: Linux carries the parent's resident set into a child's across
    fork and exec, so every run would read as large as this comparison's own process.
    """
    peak = 0
    while child.poll() is None:
        try:
            for line in Path(f"/proc/{child.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (OSError, ValueError):
            pass  # exiting, or no /proc (then the peak is unknown: 0)
        time.sleep(every_s)
    return peak


def _lr_of(run_dir: Path) -> float:
    """The lr the run trained at, as its config.yaml records it (the policy's default when none was set)."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return float(config["lr"])


def _step_seconds(run_dir: Path, images_per_step: int) -> Optional[float]:
    """Median seconds per optimizer step over the run's logged images/s."""
    rates = []
    for line in (run_dir / METRICS_FILE).read_text().splitlines():
        record = json.loads(line)
        if record.get("images_per_s"):
            rates.append(record["images_per_s"])
    return images_per_step / statistics.median(rates) if rates else None
