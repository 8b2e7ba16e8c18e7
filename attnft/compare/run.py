"""``attnft compare``: every policy on the same data and base, each at its own best, in one report.

:func:`compare` reads top to bottom: check everything a user can get wrong before anything is
written (the policies, the counts, the database, a study or folder of another comparison, the
adapter names), then the search (if asked: Optuna trials on a held-out share of the training
split), then the final runs (each policy's chosen settings on the whole training split, scored on
the evaluation split, once per seed), then the report. Everything it writes lives in the compare folder
but the chosen adapters, which land in the store as ``compare-TASK-POLICY``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..adapters.names import fit_name
from ..adapters.store import AdapterStore
from ..core.checks import check_type
from ..core.parsing import short
from ..core.errors import AttnftError, ConfigError, DiskFullError
from ..core.files import (FULL_DISK, check_outside, check_outside_attnft_folders, check_outside_store, io_error,
                          write_text_atomically)
from ..data import data_fingerprint
from ..training.config import FinetuneConfig
from ..training.plan import check_apart_from_data
from ..training.run_folder import RunLock, run_folder_id
from ..training.step_clock import progress_bar
from ..methods import parse_method
from . import study as search
from .config import MAX_SEEDS, CompareConfig
from .final import final_config, is_finished, run_final, same_recipe
from .report import final_line, policy_row, write_report
from .storage import database_full, full_database, open_storage
from .urls import masked_argv

MARKER = "compare_config.json"  # what makes a folder a comparison's, and of which task
MARKER_FORMAT = "attnft-compare"
MAX_STUDY_NAME = 512  # characters of a study name Optuna's table holds


class CompareLock(RunLock):
    """The comparison that runs a folder's final runs and writes its report owns the folder: ``compare.lock`` holds
    its pid and host, from before the folder is written until it ends. A second comparison of the folder is refused
    in one line naming the process; a ``--search-only`` worker takes no lock and shares the study's trials."""

    FILE = "compare.lock"
    HOLDER = "another comparison"
    ELSE = "run this one with --search-only to share its trials, or pass another --output-dir"


def task_label(ft: FinetuneConfig) -> str:
    """The task's name in folder, study and adapter names: a folder's own name, a hub id's, or the preset's."""
    source = ft.dataset or ft.data_dir or "fashion-mnist"
    name = os.path.basename(os.path.normpath(source)) if os.path.isdir(source) else source
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "task"


def slug(policy: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", policy)


@dataclass
class Plan:
    """What the checks settled: where the comparison writes, its policies, names, studies' identity and storage."""

    cfg: CompareConfig
    ft: FinetuneConfig
    task: str
    folder: Path
    store: AdapterStore
    names: dict  # policy -> the name of its chosen adapter in the store
    ident: dict  # policy -> what its study holds trials of
    study_base: str
    storage: object = None  # Optuna's RDBStorage, with --search


def compare(cfg: CompareConfig, ft: FinetuneConfig, command: str = "") -> Optional[dict]:
    """Run the comparison: ``attnft compare``. Every check runs before anything is written; the report is written
    in the compare folder (``compare.md``, ``compare.json``, ``compare.png``) and each policy's first-seed adapter
    goes to the store.

    Args:
        cfg: what only a comparison has: the policies, the search, the seeds, the compare folder, the study.
        ft: the fine-tuning settings every run shares (model, data, epochs, batch, ...); the comparison sets each
            run's policy, lr, weight decay, seed, output folder and name itself.
        command: the command line, recorded in the report.

    Returns:
        The report as ``compare.json`` holds it: ``policies`` (one row per policy: top-1 mean and std, the chosen
        lr and weight decay, trainable weights, adapter MB, step time, peak memory, ...), ``best`` and
        ``cheapest_within_1``; None with ``search_only``, which only runs trials.

    Raises:
        ConfigError: a folder or study that holds another comparison, an unreachable storage, a folder another
            comparison owns, or a setting finetune would refuse in one of the runs.
        StoreError: an adapter name the comparison would write exists (without ``overwrite``).
    """
    check_type(cfg, CompareConfig, "cfg", "a CompareConfig")
    check_type(ft, FinetuneConfig, "ft", "a FinetuneConfig (the settings every run shares)")
    with _a_full_disk_resumes(cfg, ft):
        plan = check_compare(cfg, ft)  # everything a user can get wrong, before anything is written
        with contextlib.nullcontext() if cfg.search_only else CompareLock(plan.folder):  # this process runs the finals
            return _compare(plan, command)


@contextlib.contextmanager
def _a_full_disk_resumes(cfg: CompareConfig, ft: FinetuneConfig):
    """Inside, a full disk (or quota) under the compare folder, the study's database or the store, found by any write
    (attnft's, Optuna's, the database's), becomes one DiskFullError line naming where and saying that a rerun
    resumes: every write is whole or absent (files atomic, the study's in transactions, adapters the store's)."""
    resumes = ("free some space there and run the comparison again (it resumes where it stopped: finished trials and "
               "final runs are kept)")
    try:
        yield
    except DiskFullError as e:
        raise DiskFullError(f"{e}: {resumes}") from None
    except OSError as e:
        if e.errno not in FULL_DISK:
            raise
        where = e.filename or cfg.output_dir or Path("compare") / task_label(ft)  # a trial's log, a folder
        raise DiskFullError(f"{io_error(e, f'writing {where}')}: {resumes}") from None
    except Exception as e:  # Optuna's, SQLAlchemy's: the study's database
        if not database_full(e):
            raise
        url = cfg.storage or _sqlite_url(Path(cfg.output_dir or Path("compare") / task_label(ft)))
        raise DiskFullError(f"{full_database(url)}: {resumes}") from None


def _compare(plan: Plan, command: str) -> Optional[dict]:
    cfg, ft = plan.cfg, plan.ft
    start_folder(plan)
    total = (cfg.search or 0) * len(cfg.policy_list) + (0 if cfg.search_only else cfg.seeds * len(cfg.policy_list))
    progress = progress_bar(total, 0, ft.progress)
    progress.set_description("compare")
    studies = {p: search_policy(plan, p, progress) for p in cfg.policy_list} if cfg.search is not None else {}
    if cfg.search_only:  # a worker ends when the study holds N trials that finished: a dead peer's are run again
        studies = {p: _settled(plan, p, study, progress) for p, study in studies.items()}
        progress.close()
        for p, study in studies.items():
            counts = search.trial_counts(study)
            print(f"{p}: {counts['complete']} finished, {counts['pruned']} pruned trial(s) in {study.study_name}")
        return None
    rows = [final_runs(plan, p, studies.get(p), progress) for p in cfg.policy_list]
    progress.close()
    header = {"task": plan.task, "model": ft.model, "res": ft.res, "epochs": ft.epochs, "command": command,
              "what": _what(cfg, ft), "search": cfg.search, "seeds": cfg.seeds, "holdout": cfg.holdout,
              "study": plan.study_base if cfg.search else None}
    report = write_report(plan.folder, rows, header)
    for line in (plan.folder / "compare.md").read_text().splitlines()[4:-3]:
        print(line)
    print(f"report: {plan.folder / 'compare.md'} (compare.json, compare.png)")
    print(final_line(rows, report))
    return report


def check_compare(cfg: CompareConfig, ft: FinetuneConfig) -> Plan:
    """The plan, once every check passed: the folder, the database, the studies and the store's names."""
    task = task_label(ft)
    folder = Path(cfg.output_dir or Path("compare") / task)
    store = AdapterStore(ft.store)
    policies = cfg.policy_list
    data_files = data_fingerprint(ft.dataset, ft.data_dir)  # a class or an image added: another study, folder
    plan = Plan(cfg=cfg, ft=ft, task=task, folder=folder, store=store,
                names={p: fit_name(["compare", task, slug(p)], shorten=1, room=len(f"-seed{MAX_SEEDS - 1}"))
                       for p in policies},
                ident={p: search.identity(ft, p, cfg.holdout, data_files) for p in policies},
                study_base=cfg.study or fit_name(["attnft-compare", task], shorten=1))
    longest = max(len(f"{plan.study_base}-{p}") for p in policies)
    if longest > MAX_STUDY_NAME:  # Optuna's column: a database would refuse it mid-way, a folder left behind
        raise ConfigError(f"--study {short(plan.study_base, 60)!r} makes study names of {longest} characters with the "
                          f"policies' specs: at most {MAX_STUDY_NAME}; pass a shorter --study")
    if importlib.util.find_spec("matplotlib") is None:  # compare.png, at the end: say it before any run
        raise ConfigError("attnft compare needs matplotlib for its picture: pip install 'attnft[compare]'")
    check_outside_attnft_folders(folder, "--output-dir")
    check_outside_store(folder, "--output-dir", store.root)
    check_apart_from_data(ft, store, {"--output-dir": folder})
    check_outside(store.root, "--store", folder, f"the compare folder {folder}",
                  "the store holds adapters only, the compare folder the comparison's runs")
    if not cfg.search_only:
        CompareLock.check_free(folder)
    _check_compare_folder(folder, plan.ident[policies[0]])
    if cfg.search is not None:
        search.require_optuna()
        if cfg.storage is not None:  # an unreachable database, before the folder is made
            plan.storage = _checked_storage(plan, cfg.storage)
        elif (folder / search.STUDY_FILE).is_file():  # a resumed comparison's: checked before its folder is written
            plan.storage = _checked_storage(plan, _sqlite_url(folder))
    for p in policies:
        if not cfg.search_only and not is_finished(_final_place(plan, p, 0)[0]):
            store.check_writable(plan.names[p], _final_place(plan, p, 0)[3])  # its own adapter, saved killed, replaced
        _check_finished_final_runs(plan, p)
        _check_runs(plan, p)
    return plan


def _check_runs(plan: Plan, policy: str) -> None:
    """What finetune would refuse in a run of ``policy`` (the model, the data, the policy on that model, the batch
    against the split a trial trains on, a step's memory): its own checks, which write nothing, before the
    comparison writes anything."""
    from ..training.plan import check_run

    cfg = dataclasses.replace(plan.ft, policy=policy, search_holdout=plan.cfg.holdout if plan.cfg.search else None,
                              output_dir=str(plan.folder / "trials" / slug(policy) / "checked"),  # no run writes there
                              store=str(plan.folder / "trials" / "adapters"), name=f"{slug(policy)}-checked",
                              overwrite=True, progress=False)
    with contextlib.ExitStack() as on_exit:
        check_run(cfg, on_exit)


def _checked_storage(plan: Plan, url: str):
    storage = open_storage(url)
    for p in plan.cfg.policy_list:
        search.check_study(storage, f"{plan.study_base}-{p}", plan.ident[p])
    return storage


def start_folder(plan: Plan) -> None:
    """The compare folder made this comparison's (its marker), and the default SQLite study opened in it."""
    plan.folder.mkdir(parents=True, exist_ok=True)
    marker = {"format": MARKER_FORMAT, **plan.ident[plan.cfg.policy_list[0]], "policies": plan.cfg.policy_list}
    write_text_atomically(plan.folder / MARKER, json.dumps(marker, indent=2) + "\n", MARKER)
    if plan.cfg.search is not None and plan.storage is None:
        plan.storage = _checked_storage(plan, _sqlite_url(plan.folder))


def _sqlite_url(folder: Path) -> str:
    """The default study database: an SQLite file in the compare folder."""
    return f"sqlite:///{(folder / search.STUDY_FILE).resolve()}"


def search_policy(plan: Plan, policy: str, progress, resumed: bool = False):
    """The search of one policy: its study's trials run until it holds --search of them; the study. ``resumed``: the
    progress bar counted the trials it holds already."""
    cfg, ft = plan.cfg, plan.ft
    default_lr = parse_method(policy).defaults.lr_for(ft.batch_size * ft.grad_accum)
    study = search.open_study(plan.storage, f"{plan.study_base}-{policy}", plan.ident[policy], cfg.pruner, ft.epochs)
    if not resumed:
        progress.update(min(len(search.counted(study)), cfg.search))  # trials run before (a resumed comparison)
    objective = search.trial_objective(ft, policy, default_lr, cfg.holdout, cfg.search_seed,
                                       plan.folder / "trials" / slug(policy), plan.folder / "trials" / "adapters",
                                       slug(policy))
    search.run_trials(study, cfg.search, objective, on_trial=lambda: progress.update(1),
                      sampler_for=functools.partial(search.trial_sampler, cfg.search_seed, policy, cfg.search))
    return study


def _settled(plan: Plan, policy: str, study, progress):
    """``study`` once no trial of it runs (other workers' end first); one failed meanwhile because its worker died
    (its heartbeat stopped) leaves the study short, and this process runs the trials missing."""
    while True:
        search.wait_for_running(study, policy, print_fn=progress.write)
        missing = plan.cfg.search - len(search.counted(study))
        if missing <= 0:
            return study
        progress.total += missing  # the bar counted the failed trials when they were running
        study = search_policy(plan, policy, progress, resumed=True)


def final_runs(plan: Plan, policy: str, study, progress) -> dict:
    """The chosen settings (or the defaults) on the whole training split, once per seed; the policy's report row."""
    cfg, ft = plan.cfg, plan.ft
    settings = _defaults(ft)
    trials = None
    if study is not None:
        study = _settled(plan, policy, study, progress)
        settings = search.chosen(study) or settings
        trials = search.trial_counts(study)
    runs = []
    for seed in range(cfg.seeds):
        runs.append(run_final(ft, policy, settings, seed, *_final_place(plan, policy, seed)))
        progress.update(1)
    return policy_row(policy, settings, runs, trials, trials["seconds"] if trials else 0.0)


def _defaults(ft: FinetuneConfig) -> search.Settings:
    """A policy's own settings, without a search: its default lr (None: the run resolves it), the weight decay asked."""
    return search.Settings(lr=None, weight_decay=ft.weight_decay, source="the policy's defaults")


def _final_place(plan: Plan, policy: str, seed: int) -> tuple[Path, Path, str, bool]:
    """Where a final run runs and saves: its folder, store, adapter name, and whether it may replace that adapter.
    The first seed's adapter is the one kept in the store (replaced with --overwrite only); the others stay in the
    compare folder, its own to replace."""
    run_dir = plan.folder / "final" / slug(policy) / f"seed-{seed}"
    if seed == 0:
        return run_dir, plan.store.root, plan.names[policy], plan.cfg.overwrite or _saved_by(plan, policy, run_dir)
    return run_dir, plan.folder / "final" / "adapters", f"{plan.names[policy]}-seed{seed}", True


def _saved_by(plan: Plan, policy: str, run_dir: Path) -> bool:
    """Whether the store's adapter of ``policy`` was saved by the final run in ``run_dir``, which did not finish (the
    comparison was stopped after the run saved it): its own, which the resumed comparison replaces."""
    name = plan.names[policy]
    if is_finished(run_dir) or not plan.store.exists(name):
        return False
    try:
        training = plan.store.config(name).training
    except AttnftError:  # unreadable: not known to be ours
        return False
    return isinstance(training, dict) and training.get("run_folder") == run_folder_id(run_dir)


def _check_finished_final_runs(plan: Plan, policy: str) -> None:
    """ConfigError for a finished final run trained from another recipe than this comparison's (without
    --overwrite): before anything runs. Its lr and weight decay are the search's to choose, compared when it has
    chosen (:func:`run_final`); without a search they are the policy's defaults, compared here."""
    defaults = _defaults(plan.ft)
    chosen = frozenset({"lr", "weight_decay"}) if plan.cfg.search is not None else frozenset()
    for seed in range(plan.cfg.seeds):
        run_dir, *place = _final_place(plan, policy, seed)
        if is_finished(run_dir):
            same_recipe(run_dir, final_config(plan.ft, policy, defaults, seed, run_dir, *place), also_ignore=chosen)


def _what(cfg: CompareConfig, ft: FinetuneConfig) -> str:
    chosen = (f"settings chosen by {cfg.search} Optuna trial(s) a policy (TPE, seed {cfg.search_seed}, {cfg.pruner} "
              f"pruner) on {cfg.holdout:.0%} of the training split held out; " if cfg.search else
              "each policy at its own defaults (no search); ")
    train = ("the whole training split" if ft.max_train is None
             else f"the training split (up to {ft.max_train:,} images)")
    scored = "the evaluation split" if ft.max_eval is None else f"the evaluation split (up to {ft.max_eval:,} images)"
    length = f"{ft.steps} step(s)" if ft.steps else f"{ft.epochs:g} epoch(s)"
    return chosen + f"then trained on {train} for {length} and scored on {scored}, {cfg.seeds} seed(s) a policy"


def _check_compare_folder(folder: Path, ident: dict) -> None:
    """ConfigError if ``folder`` holds anything but a comparison of the same task (it then resumes)."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ConfigError(f"--output-dir {folder} is a file, not a folder")
    marker = folder / MARKER
    if not marker.is_file():
        if any(p.name != CompareLock.FILE for p in folder.iterdir()):  # the lock alone: a comparison starting
            raise ConfigError(f"--output-dir {folder} is not a compare folder (it holds other files and no {MARKER}): "
                              "pass a new or empty folder")
        return
    try:
        held = json.loads(marker.read_text())
    except (OSError, ValueError):
        held = None
    if not isinstance(held, dict) or held.get("format") != MARKER_FORMAT:
        raise ConfigError(f"{marker} is not a comparison's: pass another --output-dir")
    for key, value in ident.items():  # a setting the marker predates (an older attnft's) is not compared
        if key != "policy" and key in held and held[key] != value:
            raise ConfigError(f"{folder} holds a comparison of {key} {held.get(key)!r}, not {value!r}: "
                              "pass another --output-dir")


def command_line() -> str:
    """The command as the report records it: the password of a URL in it (``--storage``) masked."""
    return "attnft " + " ".join(shlex.quote(a) for a in masked_argv(sys.argv[1:]))
