"""The search: one Optuna study per policy, its trials ordinary attnft runs scored on a held-out split.

Each trial samples the learning rate (log-uniform, 10x either side of the policy's own default at the
run's batch) and the weight decay, trains on the training split less a seeded, stratified hold-out
(``FinetuneConfig.search_holdout``), and reports the hold-out's top-1 after every epoch, so that the
pruner can stop one that lags. The evaluation split is never read by a trial.

A study lives in any database Optuna takes: by default an SQLite file in the compare folder, so a
killed comparison resumes and re-runs no finished trial; with ``--storage URL`` several processes on
several machines share its trials (each asks the study for the next one; a trial beyond the N asked
is closed unrun; each trial draws from its own seed, so two processes never draw alike). A study records what
it compares (every finetune setting that decides what a trial learns and is scored on, and the hold-out) and
refuses a comparison of anything else.
"""
from __future__ import annotations

import contextlib
import datetime
import dataclasses
import math
import os
import socket
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from .heartbeat import heartbeat
from ..core.errors import AttnftError, ConfigError, DiskFullError, DivergedError
from ..core.files import pid_alive
from ..training.config import RUN_ONLY_FIELDS, FinetuneConfig
from .config import OWN_FIELDS
from .storage import require_optuna
from .urls import safe_url

if TYPE_CHECKING:
    import optuna

STUDY_FILE = "study.db"  # the default storage, in the compare folder
WEIGHT_DECAY_RANGE = (1e-4, 0.3)
SEARCHED = ("lr", "weight_decay")  # the parameters a trial draws (trial_objective's)
ORPHAN_S = 30  # a running trial with no host and pid this long after it was asked: its worker died asking
LR_SPAN = 10.0  # the search's lr range: the default / LR_SPAN to the default x LR_SPAN
# what a study compares is every finetune setting (a comparison with another value would mix in trials of another task,
# split or recipe) but those the comparison sets per run (OWN_FIELDS) and these, which change where and how a run runs
# and reports, not what it learns (finetune's RUN_ONLY_FIELDS, and the device, compilation and memory savers) or only
# what the final runs are scored on (max_eval: their recipe is checked instead)
NOT_LEARNED = RUN_ONLY_FIELDS | {"cpu", "compile", "recompute_ffn", "grad_checkpointing", "find_unused_parameters"}
NOT_IDENTITY = NOT_LEARNED | {"max_eval"}
PATHS = ("dataset", "data_dir", "checkpoint", "teacher_checkpoint")  # the same from any working directory


@dataclass(frozen=True)
class Settings:
    """What a final run trains with: the search's choice, or the policy's own defaults (lr None)."""

    lr: Optional[float]
    weight_decay: float
    source: str  # "default", or "trial 3 (held-out top-1 71.20%)"
    val_top1: Optional[float] = None


def identity(ft: FinetuneConfig, policy: str, holdout: Optional[float], data_files: Optional[str] = None) -> dict:
    """What a study's trials are of, as its user attributes hold it (JSON values): the settings, what the data's
    folder holds (``data_files``, :func:`attnft.data.data_fingerprint`; None: a hub dataset or a preset's files) and
    the hold-out (None: a comparison without a search, whose folder is then compared on the rest)."""
    data = {"data_files": data_files} if data_files is not None else {}
    split = {"holdout": holdout} if holdout is not None else {}
    return {**settings_of(ft.to_dict(), OWN_FIELDS | NOT_IDENTITY), **data, "policy": policy, **split}


def settings_of(values: dict, leave_out: frozenset) -> dict:
    """``values`` (a ``FinetuneConfig.to_dict``) less ``leave_out``, its paths absolute where they exist: the same
    however the command spelled them."""
    kept = {k: v for k, v in values.items() if k not in leave_out}
    for key in PATHS:
        if isinstance(kept.get(key), str) and os.path.exists(kept[key]):
            kept[key] = os.path.abspath(kept[key])
    return kept


def open_study(storage, name: str, ident: dict, pruner: str, epochs: int):
    """The study ``name`` (created, or joined), checked to be a search of attnft's holding trials of ``ident`` only
    (:func:`check_study`) before anything is written into it. Its sampler is set per trial (:func:`run_trials`)."""
    optuna = require_optuna()
    check_study(storage, name, ident)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize",
                                pruner=_pruner(optuna, pruner, epochs), load_if_exists=True)
    for key, value in ident.items():
        if key not in study.user_attrs:
            study.set_user_attr(key, value)
    return study


def check_study(storage, name: str, ident: dict) -> None:
    """ConfigError if the study ``name`` exists and is no search of attnft's (another direction, several objectives,
    trials of other parameters) or holds trials of anything but ``ident``; reads only."""
    optuna = require_optuna()
    try:
        study = optuna.load_study(study_name=name, storage=storage, sampler=optuna.samplers.RandomSampler())
    except KeyError:
        return  # not there yet
    where = f"the study {name} in {safe_url(getattr(storage, 'url', 'memory'))}"
    fix = "pass another --study (or --output-dir)"
    directions = [d.name.lower() for d in study.directions]
    if directions != ["maximize"]:
        what = f"{len(directions)} objectives" if len(directions) > 1 else f"one objective to {directions[0]}"
        raise ConfigError(f"{where} is no search of attnft compare: it has {what}, attnft's maximizes one (the held-out "
                          f"top-1): {fix}")
    foreign = sorted({p for t in study.get_trials(deepcopy=False) for p in t.distributions} - set(SEARCHED))
    if foreign:
        raise ConfigError(f"{where} is no search of attnft compare: its trials draw {', '.join(foreign)[:80]}, "
                          f"attnft's draw {' and '.join(SEARCHED)}: {fix}")
    for key, value in ident.items():
        if key in study.user_attrs and study.user_attrs[key] != value:
            raise ConfigError(f"{where} holds trials of {key} {study.user_attrs[key]!r}, not {value!r}: {fix}")


def trial_sampler(seed: int, policy: str, search: int, number: int):
    """The sampler that draws trial ``number`` of ``policy``'s study: TPE, random for the first half of the
    ``search`` trials, seeded from ``seed``, the policy and the trial's number. Each trial its own seed: a
    process that joins or resumes a study draws new settings, not those its first trial drew in another process
    (workers seeded alike would all run the same settings), and a search resumed between trials draws what it
    would have drawn unkilled."""
    optuna = require_optuna()
    trial_seed = (seed * 1_000_003 + zlib.crc32(policy.encode()) + number * 7_919) % 2**32
    return optuna.samplers.TPESampler(seed=trial_seed, n_startup_trials=max(2, min(10, search // 2)))


def _pruner(optuna, kind: str, epochs: int):
    if kind == "median":  # after two finished trials, from the first epoch's evaluation on
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    if kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(epochs, 1))
    return optuna.pruners.NopPruner()


def lr_range(default_lr: float) -> tuple[float, float]:
    return default_lr / LR_SPAN, min(default_lr * LR_SPAN, 1.0)


def counted(study) -> list:
    """The trials that count toward the N asked, in order: finished, pruned, or running (not failed)."""
    from optuna.trial import TrialState

    alive = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    return sorted((t for t in study.get_trials(deepcopy=False) if t.state in alive), key=lambda t: t.number)


def fail_dead_trials(study) -> None:
    """Close as failed the running trials whose process is gone: at once those of this machine (a comparison killed
    here, or stopped by an error in this very process, which runs no trial while it looks), those of any machine
    whose heartbeat stopped :data:`.storage.GRACE_S` ago (Optuna's stale trials), and those that say no owner
    :data:`ORPHAN_S` after they were asked (a worker records its host and pid right after asking)."""
    import optuna
    from optuna.trial import TrialState

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    now = datetime.datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        host, pid = trial.user_attrs.get("host"), trial.user_attrs.get("pid")
        if host == socket.gethostname() and isinstance(pid, int) and (pid == os.getpid() or not pid_alive(pid)):
            _tell(study, trial.number, state=TrialState.FAIL)  # by number: public, from any process
        elif host is None and trial.datetime_start and (now - trial.datetime_start).total_seconds() > ORPHAN_S:
            # asked by a worker killed before it said whose the trial is (or started its heartbeat): no one's
            _tell(study, trial.number, state=TrialState.FAIL)


def run_trials(study, search: int, objective: Callable, on_trial: Callable[[], None],
               sampler_for: Callable[[int], Any]) -> None:
    """Ask the study for trials and run them until it holds ``search`` that count, each drawn by the sampler
    ``sampler_for(its number)`` (:func:`trial_sampler`); ``on_trial`` after each one."""
    from optuna import TrialPruned
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    fail_dead_trials(study)
    while len(counted(study)) < search:
        with warnings.catch_warnings():  # Optuna says so of ask-and-tell: .heartbeat keeps it as optimize does
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            trial = study.ask()
        study.sampler = sampler_for(trial.number)  # the trial samples lazily, at its suggest calls: from this one
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("pid", os.getpid())
        if trial.number not in [t.number for t in counted(study)[:search]]:
            # another worker asked for the last one first: close this one unrun
            trial.set_user_attr("unrun", "the study already had its trials")
            study.tell(trial, state=TrialState.FAIL)
            break
        try:
            with heartbeat(study, trial):
                value = objective(trial)
        except TrialPruned:
            _tell(study, trial, state=TrialState.PRUNED)
        except UpdateFinishedTrialError:  # from the trial's report: another process failed it, its heartbeat stale
            pass
        except BaseException:
            # the error says what went wrong; a database that cannot take the failure too (its disk full) leaves the
            # trial running, and the next process fails it as dead
            with contextlib.suppress(Exception):
                _tell(study, trial, state=TrialState.FAIL)
            raise
        else:
            _tell(study, trial, value)
        on_trial()


def _tell(study, trial, *args, **kwargs) -> None:
    """``study.tell``; a trial another process failed meanwhile (its heartbeat was stale: this process was stopped,
    or its database out of reach, longer than the grace period) stays failed and does not count."""
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        study.tell(trial, *args, **kwargs)
    except UpdateFinishedTrialError:
        pass


def wait_for_running(study, what: str, poll_s: float = 10.0, print_fn=print) -> None:
    """Return once no trial of ``study`` is running (other workers' trials end first)."""
    from optuna.trial import TrialState

    said = False
    while True:
        fail_dead_trials(study)
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
        if not running:
            return
        if not said:
            print_fn(f"{what}: waiting for {len(running)} trial(s) running elsewhere "
                     f"({', '.join(str(t.user_attrs.get('host', '?')) for t in running)})")
            said = True
        time.sleep(poll_s)


def chosen(study) -> Optional[Settings]:
    """The settings of the study's best finished trial (ties: the earliest); None if none finished."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None
            and math.isfinite(t.value)]
    if not done:
        return None
    best = max(done, key=lambda t: (t.value, -t.number))
    return Settings(lr=best.params["lr"], weight_decay=best.params["weight_decay"], val_top1=best.value,
                    source=f"trial {best.number}, the best of {len(done)} finished (held-out top-1 {best.value:.2f}%)")


def trial_counts(study) -> dict:
    """How many trials finished, were pruned or failed, and the seconds the finished and pruned ones took."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    seconds = sum(t.duration.total_seconds() for t in trials
                  if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.duration is not None)
    return {"complete": states.count(TrialState.COMPLETE), "pruned": states.count(TrialState.PRUNED),
            "failed": states.count(TrialState.FAIL), "seconds": round(seconds, 1)}


def _release_device_memory() -> None:
    """Hand the trial's GPU memory back (torch keeps freed blocks cached for the process): the next trial, and the
    final runs in their own processes, get all of it."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _drop_adapter(store: Path, name: str) -> None:
    """Remove the adapter a trial saved: nothing reads it (the study keeps the settings the final runs retrain), and
    a search of N trials would keep N of them, each as large as the policy's trained weights."""
    from ..adapters.store import AdapterStore

    trials = AdapterStore(store)
    if trials.exists(name):
        trials.delete(name)


def trial_objective(ft: FinetuneConfig, policy: str, default_lr: float, holdout: float, seed: int, folder: Path,
                    store: Path, slug: str) -> Callable:
    """The function a trial runs: one attnft run, in this process, its output in ``folder/trial-NNN``; the adapter
    it saves in ``store`` is removed when it ends."""
    from ..training.runner import finetune

    low, high = lr_range(default_lr)

    def objective(trial) -> float:
        import optuna

        lr = trial.suggest_float("lr", low, high, log=True)
        weight_decay = trial.suggest_float("weight_decay", *WEIGHT_DECAY_RANGE, log=True)
        run_dir = folder / f"trial-{trial.number:03d}"
        trial.set_user_attr("run_dir", str(run_dir))
        cfg = dataclasses.replace(ft, policy=policy, lr=lr, weight_decay=weight_decay, seed=seed,
                                  search_holdout=holdout, eval_every=1, eval_before=False, progress=False,
                                  output_dir=str(run_dir), store=str(store), name=f"{slug}-trial-{trial.number:03d}",
                                  overwrite=True)

        def report(epoch: int, result) -> None:
            if result.top1 is not None:
                trial.report(result.top1, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"held-out top-1 {result.top1:.2f}% after epoch {epoch}")

        folder.mkdir(parents=True, exist_ok=True)
        with open(run_dir.parent / f"trial-{trial.number:03d}.log", "w") as log, contextlib.redirect_stdout(log):
            try:
                result = finetune(cfg, on_epoch=report)
            except DivergedError as e:  # an outcome of its settings (an lr too high), not the user's: it ends pruned
                trial.set_user_attr("diverged", str(e))
                raise optuna.TrialPruned(f"diverged: {e}") from None
            except DiskFullError as e:  # freeing space is the fix, not another setting
                raise DiskFullError(f"trial {trial.number} of {policy} failed: {e}") from None
            except AttnftError as e:
                raise ConfigError(f"trial {trial.number} of {policy} failed: {e}") from None
            finally:
                _drop_adapter(store, cfg.name)
                _release_device_memory()
        return float(result.accuracy_after)

    return objective
