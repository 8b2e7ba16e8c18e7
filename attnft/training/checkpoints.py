"""Resumable checkpoints: ``step_N.pt`` in the run's ``checkpoints/`` folder.

Every random draw of a run is a function of the seed and of where it happens
(:mod:`attnft.training.seeding`), so a checkpoint needs no RNG state: the trainable weights, optimizer,
schedule, (fp16) scaler, the model EMA's averaged tensors (``--model-ema``) and the :class:`Position`
are enough for a resumed run to end bitwise equal to an uninterrupted one on the CPU. Files are
written atomically and read with ``weights_only``; a bad one is one ConfigError line that says what to delete.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from .config import RUN_ONLY_FIELDS
from ..core.errors import ConfigError
from ..core.files import io_error, remove_entry
from .processes import on_main
from .run_folder import CHECKPOINT_DIR, CHECKPOINT_FILE, checkpoint_tmp_name


@dataclass
class Position:
    """Where training is: optimizer steps done, the epoch, and micro-batches of it consumed."""

    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0


def save_checkpoint(directory: Path, position: Position, model: nn.Module, optimizer, scheduler, accelerator,
                    config: dict, keep: int, accuracy_before: Optional[float], ema=None) -> Optional[Path]:
    """Write ``step_N.pt`` atomically (temp file, fsync, rename) and keep the newest ``keep``.

    Holds the trainable weights only (frozen ones come from the base), the optimizer, the
    schedule, the fp16 scaler, the position, the run's ``config`` (``FinetuneConfig.to_dict``, which a
    resume compares) and ``ema``'s averaged tensors (None without one).
    Called by every process; the main one writes.
    A failed write (full disk) is one StoreError line on every process, leaving no temporary file.
    """
    written = []

    def write() -> None:
        state = {
            "position": asdict(position),
            "trainable": {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
            "config": config,
            "accuracy_before": accuracy_before,
            "ema": ema.trained_state() if ema is not None else None,
        }
        path = directory / f"step_{position.step:08d}.pt"
        tmp = directory / checkpoint_tmp_name(path.name)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                out = _RecordingWrites(f)
                try:
                    torch.save(state, out)
                except RuntimeError as e:  # torch reports the OSError of a failed write as an "enforce fail"
                    if out.error is None:
                        raise
                    raise out.error from e
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            for old in _checkpoints(directory)[:-keep]:
                old.unlink()
        except OSError as e:
            remove_entry(tmp)
            raise io_error(e, f"writing checkpoint {path.name} to {directory}") from None
        written.append(path)

    on_main(accelerator, write)
    return written[0] if written else None


class _RecordingWrites:
    """A file for torch.save that keeps the OSError of a failed write, which torch turns into a bare RuntimeError."""

    def __init__(self, file):
        self.file = file
        self.error: Optional[OSError] = None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def load_checkpoint(path: Path, model: nn.Module, optimizer, scheduler, accelerator, ema=None) -> dict:
    """Restore what :func:`save_checkpoint` wrote into the (unwrapped) model, optimizer, schedule and ``ema``."""
    state = _read_checkpoint(path)
    params = dict(model.named_parameters())
    try:
        with torch.no_grad():
            for name, value in state["trainable"].items():
                params[name].copy_(value)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if state["scaler"] is not None and accelerator.scaler is not None:
            accelerator.scaler.load_state_dict(state["scaler"])
        if ema is not None:
            ema.load_trained_state(state.get("ema"))  # absent from checkpoints made before --model-ema existed
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise _corrupt_checkpoint(path, f"it does not fit this run: {type(e).__name__} {e}") from None
    return state


def resumed_position(state: dict, path: Path, total_steps: int, steps_per_epoch: Optional[int]) -> Position:
    """Where the checkpoint ``state`` stopped, checked against this run's length (a step of 10**30 is no
    checkpoint this run wrote): a corrupt-checkpoint ConfigError otherwise."""
    try:
        position = Position(**state["position"])
        numbers = (position.step, position.epoch, position.batches_in_epoch)
        valid = all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers)
    except TypeError:
        valid = False
    if not valid or position.step > total_steps or (steps_per_epoch and position.epoch > total_steps // steps_per_epoch + 1):
        raise _corrupt_checkpoint(path, f"its position {state.get('position')!r:.80} is not a step of this "
                                        f"{total_steps}-step run")
    return position


def latest_checkpoint(directory: Path) -> Optional[Path]:
    found = _checkpoints(directory)
    return found[-1] if found else None


def find_resume_checkpoint(output_dir: Path, config: dict) -> Optional[Path]:
    """The newest checkpoint of the run in ``output_dir``, after checking it was made with the same settings
    (``config``: the resuming run's ``FinetuneConfig.to_dict``)."""
    path = latest_checkpoint(output_dir / CHECKPOINT_DIR)
    if path is None:
        return None
    saved = _read_checkpoint(path, mmap=True)["config"]  # mmap: reads no tensor
    now = config
    differ = [k for k in now if k not in RUN_ONLY_FIELDS and k in saved and saved[k] != now[k]]
    if differ:
        shown = ", ".join(f"{k}={saved[k]!r} (now {now[k]!r})" for k in differ[:4])
        raise ConfigError(f"the checkpoint {path} was made with {shown}: resume with the same settings, "
                          f"or start over without --resume and with --overwrite")
    return path


def _read_checkpoint(path: Path, mmap: bool = False) -> dict:
    """The dict :func:`save_checkpoint` wrote; ConfigError (one line, never torch's advice to unpickle
    more with weights_only=False) for a file that is truncated, corrupt, or holds other objects."""
    import pickle
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's notes on pickle protocols
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:  # weights_only refused it, or it is no pickle at all
        raise _corrupt_checkpoint(path, "it holds data a checkpoint never holds") from None
    except Exception as e:  # noqa: BLE001  every reader fails its own way on a bad file; the cause is the file
        raise _corrupt_checkpoint(path, _first_sentence(e)) from None
    keys = {"position", "trainable", "optimizer", "scheduler", "scaler", "config", "accuracy_before"}
    if not isinstance(state, dict) or not keys <= set(state):
        raise _corrupt_checkpoint(path, "it is not a checkpoint attnft wrote")
    return state


def _corrupt_checkpoint(path: Path, why: str) -> ConfigError:
    older = [p for p in _checkpoints(path.parent) if p != path]
    instead = f"delete it to resume from {older[-1].name}" if older else "delete it"
    return ConfigError(f"the checkpoint {path} is corrupt or unsafe to load ({why}): {instead}, "
                       f"or start over without --resume and with --overwrite")


def _first_sentence(error: Exception) -> str:
    text = " ".join(str(error).split()).split(". ")[0][:200]
    if not text or "weights_only" in text:
        return type(error).__name__
    return text


def _checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := CHECKPOINT_FILE.fullmatch(p.name))]
    return [p for _, p in sorted(found)]
