"""``attnft compare``: every policy on the same data and base, chosen on a held-out split, one report.

Real runs of the bundled 28 px model on a small folder of real Fashion-MNIST images (3 classes), a real
SQLite study, and two worker processes sharing one study on a real PostgreSQL server (tests/postgres.py).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from PIL import Image

from attnft.cli import main
from attnft.data.fashion_mnist import LABEL_NAMES, read_fashion_mnist
from attnft.methods.peft.spec import PEFT_METHODS
from attnft.methods.freeze.policy import BASE_DEFAULTS
from test_runner import _fails_cleanly, _snapshot

optuna = pytest.importorskip("optuna")

REPO = Path(__file__).resolve().parent.parent
FLAGS = ["--model", "vit_fmnist_patch4_28", "--epochs", "1", "--batch-size", "32", "--workers", "0", "--no-progress"]


def fashion_folder(root: Path, classes=(0, 1, 7), train=40, test=15) -> Path:
    """root/{train,test}/<class>/<i>.png: real Fashion-MNIST images of three classes (the bundled sample)."""
    for split, count in (("train", train), ("test", test)):
        images, labels = read_fashion_mnist(split)
        for c in classes:
            folder = root / split / LABEL_NAMES[c].replace("/", "-")
            folder.mkdir(parents=True, exist_ok=True)
            for i in [i for i in range(len(labels)) if labels[i] == c][:count]:
                Image.fromarray(images[i]).save(folder / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return fashion_folder(tmp_path_factory.mktemp("data") / "clothes")


def compare_argv(data, out, store, *extra, policies="attn,lora", search="2"):
    argv = ["compare", "--dataset", str(data), "--policies", policies, "--seeds", "1", "--output-dir", str(out),
            "--store", str(store), *FLAGS, *extra]
    return argv + (["--search", search] if search else [])


def study_of(out: Path, name: str):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'study.db'}")


@pytest.fixture(scope="module")
def compared(data, tmp_path_factory):
    """One comparison of attn and lora, 2 trials each, 1 seed, 1 epoch: its folder and store."""
    root = tmp_path_factory.mktemp("compare")
    assert main(compare_argv(data, root / "out", root / "store")) == 0
    return root / "out", root / "store"


def test_compare_writes_the_table_the_json_and_the_picture(compared):
    out, _ = compared
    report = json.loads((out / "compare.json").read_text())
    assert [row["policy"] for row in report["policies"]] == ["attn", "lora"]
    for row in report["policies"]:
        for key in ("top1_mean", "top1_std", "val_top1", "trainable_params", "trainable_share", "adapter_mb",
                    "full_checkpoint_mb", "step_s", "peak_rss_mb", "wall_s", "lr", "weight_decay"):
            assert row[key] is not None, key
        assert 0 <= row["top1_mean"] <= 100 and row["peak_rss_mb"] > 100 and row["step_s"] > 0
        assert row["trials"]["complete"] + row["trials"]["pruned"] == 2
        assert re.fullmatch(rf"trial [01], the best of {row['trials']['complete']} finished \(held-out top-1 [\d.]+%\)",
                            row["chosen_by"]), row["chosen_by"]
    lora, attn = report["policies"][1], report["policies"][0]
    assert lora["trainable_params"] < attn["trainable_params"] and lora["adapter_mb"] < attn["adapter_mb"]
    assert report["best"] in ("attn", "lora") and report["cheapest_within_1"] in ("attn", "lora")
    table = (out / "compare.md").read_text()
    assert "| attn |" in table and "| lora |" in table and "held-out top-1" in table
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_chosen_settings_are_the_best_trial_of_each_study_and_the_lr_is_searched_around_the_default(compared):
    out, _ = compared
    report = {row["policy"]: row for row in json.loads((out / "compare.json").read_text())["policies"]}
    for policy, default_lr in (("attn", BASE_DEFAULTS["attn"].lr), ("lora", PEFT_METHODS["lora"].defaults.lr)):
        study = study_of(out, f"attnft-compare-clothes-{policy}")
        best = max((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: (t.value, -t.number))
        assert report[policy]["lr"] == best.params["lr"] and report[policy]["val_top1"] == best.value
        for trial in study.trials:  # around the default at batch 32: x 32 / 64
            assert default_lr / 2 / 10 <= trial.params["lr"] <= default_lr / 2 * 10


def test_every_trial_is_an_ordinary_run_scored_on_a_held_out_share_of_the_training_split(compared):
    import yaml

    out, store = compared
    for policy in ("attn", "lora"):
        for trial in sorted((out / "trials" / policy).glob("trial-*[0-9]")):
            assert {"metrics.jsonl", "result.json", "config.yaml"} <= {p.name for p in trial.iterdir()}
            config = yaml.safe_load((trial / "config.yaml").read_text())
            assert config["search_holdout"] == 0.2
            result = json.loads((trial / "result.json").read_text())
            assert result["final_eval"]["num_samples"] == 24  # 20% of 120 training images: never the 45 test ones
        final = out / "final" / policy / "seed-0"
        assert yaml.safe_load((final / "config.yaml").read_text())["search_holdout"] is None
        assert json.loads((final / "result.json").read_text())["final_eval"]["num_samples"] == 45
    assert sorted(p.name for p in store.iterdir()) == ["compare-clothes-attn", "compare-clothes-lora"]


def test_a_comparison_run_again_runs_nothing_again_and_reports_the_same(compared, capsys):
    out, store = compared
    before = json.loads((out / "compare.json").read_text())
    runs = {p: p.stat().st_mtime_ns for p in out.rglob("result.json")}
    assert main(compare_argv(_data_of(out), out, store)) == 0
    assert {p: p.stat().st_mtime_ns for p in out.rglob("result.json")} == runs
    after = json.loads((out / "compare.json").read_text())
    assert [r["top1"] for r in after["policies"]] == [r["top1"] for r in before["policies"]]
    assert "best:" in capsys.readouterr().out


def _data_of(out: Path) -> Path:
    return Path(json.loads((out / "compare_config.json").read_text())["dataset"])


def _finished_trials(out: Path, name: str) -> int:
    """Trials the study records as finished or pruned (0 before the study exists)."""
    if not (out / "study.db").exists():
        return 0
    from sqlalchemy.exc import IntegrityError, OperationalError

    try:
        return len([t for t in study_of(out, name).trials if t.state.name in ("COMPLETE", "PRUNED")])
    except (KeyError, OperationalError, IntegrityError):  # the file is there, its tables or study being created
        return 0


def test_a_comparison_killed_after_its_first_trial_finishes_without_running_it_again(data, tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    argv = [sys.executable, "-m", "attnft", *compare_argv(data, out, store, policies="attn")]
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    first = out / "trials" / "attn" / "trial-000" / "result.json"
    deadline = time.monotonic() + 240
    while not _finished_trials(out, "attnft-compare-clothes-attn") and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert first.exists()
    stamp = first.stat().st_mtime_ns
    assert main(compare_argv(data, out, store, policies="attn")) == 0
    assert first.stat().st_mtime_ns == stamp  # trial 0 was not run again
    study = study_of(out, "attnft-compare-clothes-attn")
    done = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(done) == 2 and done[0].number == 0
    assert json.loads((out / "compare.json").read_text())["policies"][0]["trials"]["complete"] + \
        json.loads((out / "compare.json").read_text())["policies"][0]["trials"]["pruned"] == 2


def test_without_search_each_policy_runs_at_its_own_default_lr(data, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(compare_argv(data, out, tmp_path / "store", policies="head", search=None)) == 0
    row = json.loads((out / "compare.json").read_text())["policies"][0]
    assert row["lr"] == pytest.approx(BASE_DEFAULTS["head"].lr * 32 / 64)  # the default at batch 64, x 32 / 64
    assert row["val_top1"] is None and row["trials"] is None
    assert not (out / "study.db").exists() and not (out / "trials").exists()


@pytest.mark.parametrize("extra, words", [
    (["--policies", "attn,atn"], ["--policies", "unknown policy 'atn'"]),
    (["--search", "0"], ["--search must be from 1"]),
    (["--search", "-3"], ["--search must be from 1"]),
    (["--seeds", "0"], ["--seeds must be from 1"]),
    (["--storage", "postgresql://nobody@127.0.0.1:1/none"], ["cannot use the study database", "127.0.0.1:1"]),
    (["--storage", "nosuchdb://x"], ["cannot use the study database"]),
    (["--model", "vit_no_such_model"], ["unknown model 'vit_no_such_model'"]),
    (["--dataset", "/nonexistent/clothes"], ["/nonexistent/clothes"]),
    (["--policies", "attn,lora@9-11"], ["@9-11"]),  # blocks the 28 px model has not: its own run's check
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, data, tmp_path, extra, words):
    out = tmp_path / "out"
    argv = compare_argv(data, out, tmp_path / "store", search="2") + extra
    _fails_cleanly(capsys, argv, words=words, untouched=[tmp_path])
    assert not out.exists() and not (tmp_path / "store").exists()


def test_a_folder_that_is_no_compare_folder_is_refused_untouched(capsys, data, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    _fails_cleanly(capsys, compare_argv(data, mine, tmp_path / "store"), words=["is not a compare folder"],
                   untouched=[tmp_path])


def test_a_study_of_another_dataset_is_refused_before_any_trial(capsys, compared, tmp_path):
    out, _ = compared
    other = fashion_folder(tmp_path / "other", classes=(2, 3, 4), train=10, test=5)
    storage = f"sqlite:///{out / 'study.db'}"
    before = _snapshot([out])
    argv = compare_argv(other, tmp_path / "out2", tmp_path / "store2", "--storage", storage, "--study",
                        "attnft-compare-clothes")
    _fails_cleanly(capsys, argv, words=["holds trials of dataset"], untouched=[out])
    assert _snapshot([out]) == before and not (tmp_path / "out2").exists()
    # the compare folder of another task, the same way
    _fails_cleanly(capsys, compare_argv(other, out, tmp_path / "store2"), words=["holds a comparison of dataset"],
                   untouched=[out])
    # or of another recipe: its trials were trained otherwise
    _fails_cleanly(capsys, compare_argv(_data_of(out), out, tmp_path / "store2", "--optimizer", "sgd"),
                   words=["holds a comparison of optimizer 'adamw', not 'sgd'"], untouched=[out])


def test_two_workers_share_one_postgresql_study_and_split_its_trials(data, tmp_path, postgres_url):
    """Two processes on one study (as on two machines): the trials are split between them, none runs twice,
    and a third process that reports from the study chooses what the study's best trial says."""
    study = "two-workers"
    workers = []
    for worker in ("w1", "w2"):
        argv = [sys.executable, "-m", "attnft", *compare_argv(data, tmp_path / worker, tmp_path / "store",
                                                              "--storage", postgres_url, "--study", study,
                                                              "--search-only", policies="attn", search="4")]
        workers.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for child in workers:
        out, err = child.communicate(timeout=280)
        assert child.returncode == 0, err
    loaded = optuna.load_study(study_name=f"{study}-attn", storage=postgres_url)
    counted = [t for t in loaded.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(counted) == 4 and len({t.number for t in counted}) == 4
    pids = {t.user_attrs["pid"] for t in counted}
    assert pids == {w.pid for w in workers}  # both worked
    assert len({(t.params["lr"], t.params["weight_decay"]) for t in counted}) == 4  # and drew settings of their own
    runs = sorted(str(Path(t.user_attrs["run_dir"]).relative_to(tmp_path)) for t in counted)
    ran = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.glob("w*/trials/attn/trial-*/result.json"))
    assert runs == ran  # each trial ran once, in the folder of the worker that took it
    # the report, from one process: no trial run again, the settings of the study's best trial
    assert main(compare_argv(data, tmp_path / "report", tmp_path / "store", "--storage", postgres_url, "--study", study,
                             policies="attn", search="4")) == 0
    assert len([t for t in optuna.load_study(study_name=f"{study}-attn", storage=postgres_url).trials
                if t.state.name in ("COMPLETE", "PRUNED")]) == 4
    best = max((t for t in counted if t.state.name == "COMPLETE"), key=lambda t: (t.value, -t.number))
    row = json.loads((tmp_path / "report" / "compare.json").read_text())["policies"][0]
    assert (row["lr"], row["weight_decay"], row["val_top1"]) == (best.params["lr"], best.params["weight_decay"],
                                                                best.value)


def test_the_report_says_how_much_of_each_split_the_final_runs_read():
    from attnft.compare.config import CompareConfig
    from attnft.compare.run import _what
    from attnft.training.config import FinetuneConfig

    assert _what(CompareConfig(search=8), FinetuneConfig(max_train=2000, max_eval=1000, epochs=1)).endswith(
        "then trained on the training split (up to 2,000 images) for 1 epoch(s) and scored on the evaluation split "
        "(up to 1,000 images), 1 seed(s) a policy")
    assert "trained on the whole training split for 30 step(s) and scored on the evaluation split," in _what(
        CompareConfig(), FinetuneConfig(steps=30, max_train=None, max_eval=None))


def test_each_trial_draws_from_its_own_number_so_a_resumed_or_joining_process_draws_new_settings():
    """Trial N's settings come from (seed, policy, N): a search resumed after two trials draws what it would have drawn
    unkilled, and a process joining a study draws settings of its own, not those the first process drew first."""
    from attnft.compare.study import open_study, run_trials, trial_sampler

    def search(storage, name, trials):
        study = open_study(storage, name, {"policy": "attn"}, "none", 1)
        drawn = []

        def objective(trial):
            drawn.append((trial.number, trial.suggest_float("lr", 1e-5, 1e-2, log=True)))
            return drawn[-1][1]

        run_trials(study, trials, objective, lambda: None, lambda n: trial_sampler(0, "attn", 8, n))
        return drawn

    unkilled = search(optuna.storages.InMemoryStorage(), "one", 4)
    storage = optuna.storages.InMemoryStorage()
    resumed = search(storage, "two", 2) + search(storage, "two", 4)  # a second process goes on from trial 2
    assert resumed == unkilled
    assert len({lr for _, lr in unkilled}) == 4


def test_a_final_run_of_other_settings_is_refused_then_run_again_with_overwrite(data, tmp_path, capsys):
    """A finished final run is read back only if it was trained from the same recipe: else one line, and with
    --overwrite it is run again and its adapter replaced."""
    out, store = tmp_path / "out", tmp_path / "store"
    assert main(compare_argv(data, out, store, policies="head", search=None)) == 0
    run = out / "final" / "head" / "seed-0"
    stamp = (run / "result.json").stat().st_mtime_ns
    before = _snapshot([out, store])
    _fails_cleanly(capsys, compare_argv(data, out, store, "--max-eval", "9", policies="head", search=None),
                   words=["was trained with other settings", "max_eval None, now 9", "--overwrite"],
                   untouched=[out, store])
    assert _snapshot([out, store]) == before
    # spelled otherwise, with settings that change nothing it learns: the same recipe, read back
    assert main(compare_argv(f"{data}/", out, store, "--workers", "1", "--log-every", "3", policies="head",
                             search=None)) == 0
    assert _snapshot([out / "final", store]) == {k: v for k, v in before.items() if "/final/" in k or str(store) in k}
    assert main(compare_argv(data, out, store, "--max-eval", "9", "--overwrite", policies="head", search=None)) == 0
    assert (run / "result.json").stat().st_mtime_ns != stamp
    assert yaml.safe_load((run / "config.yaml").read_text())["max_eval"] == 9


def test_policy_specs_with_option_lists_can_be_compared():
    from attnft.compare.config import CompareConfig

    assert CompareConfig(policies="lora:r=16,alpha=32,attn, ia3").policy_list == ["lora:r=16,alpha=32", "attn", "ia3"]


def test_a_trial_whose_worker_died_elsewhere_is_failed_once_its_heartbeat_is_stale(tmp_path):
    """A trial left running by a worker on another machine (no pid to look at here) stops counting toward N and
    holding up the report once its heartbeat is older than the grace period (Optuna's stale trials)."""
    from attnft.compare.study import counted, fail_dead_trials

    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    with pytest.warns(UserWarning, match="Heartbeat"):  # Optuna's note on ask-and-tell, which attnft keeps quiet
        trial = study.ask()
    trial.set_user_attr("host", "a-machine-elsewhere")
    storage.record_heartbeat(trial._trial_id)  # its last beat
    fail_dead_trials(study)
    assert [t.number for t in counted(study)] == [0]  # within the grace period it still counts
    time.sleep(2.5)
    fail_dead_trials(study)
    assert counted(study) == [] and study.trials[0].state.name == "FAIL"


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl's parent-death signal is Linux's")
def test_a_final_run_ends_with_the_comparison_that_started_it_even_killed(data, tmp_path):
    """SIGKILL leaves the comparison no chance to stop its final run: the run ends by itself (the parent-death
    signal), instead of saving into the store and the compare folder behind a comparison that is gone."""
    out, store = tmp_path / "out", tmp_path / "store"
    argv = [sys.executable, "-m", "attnft", *compare_argv(data, out, store, policies="head", search=None)]
    parent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not _children(parent.pid) and parent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    children = _children(parent.pid)
    assert children, "the final run never started"
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(_running(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(c) for c in children)
    assert not (store / "compare-clothes-head").exists()


@pytest.mark.filterwarnings("ignore:Fixed parameter")  # Optuna's, on the enqueued lr outside the range
def test_a_trial_that_diverges_ends_pruned_and_the_search_goes_on(data, tmp_path):
    """An lr too high for the policy is what a search is there to find: the trial is pruned (it counts toward N and
    is never chosen), not the end of the comparison."""
    from attnft.compare.study import open_study, run_trials, trial_objective, trial_sampler
    from attnft.training.config import FinetuneConfig

    ft = FinetuneConfig(dataset=str(data), model="vit_fmnist_patch4_28", epochs=1, batch_size=32, workers=0,
                        progress=False)
    study = open_study(optuna.storages.InMemoryStorage(), "s", {"policy": "full"}, "none", 1)
    study.enqueue_trial({"lr": 1e3, "weight_decay": 1e-4})  # an lr no search would draw: it breaks the weights
    objective = trial_objective(ft, "full", 5e-4, 0.2, 0, tmp_path / "trials", tmp_path / "adapters", "full")
    run_trials(study, 2, objective, lambda: None, lambda n: trial_sampler(0, "full", 2, n))
    first, second = study.trials
    assert first.state.name == "PRUNED" and "diverged" in first.user_attrs["diverged"]
    assert second.state.name == "COMPLETE"


@pytest.mark.parametrize("extra", [[], ["--search-only"]])
def test_the_reporting_process_runs_the_trial_a_dead_worker_left_running(data, tmp_path, monkeypatch, capsys, extra):
    """A worker died elsewhere mid-trial: its trial counted toward N while its heartbeat was fresh; once stale it is
    failed, and the process that reports runs the trial missing instead of waiting for it for ever; a --search-only
    worker too, instead of stopping a trial short."""
    import attnft.compare.storage as storages

    monkeypatch.setattr(storages, "HEARTBEAT_S", 1)
    monkeypatch.setattr(storages, "GRACE_S", 6)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    storage = storages.open_storage(url)
    study = optuna.create_study(study_name="shared-attn", storage=storage, direction="maximize")
    with pytest.warns(UserWarning, match="Heartbeat"):
        dead = study.ask()
    dead.set_user_attr("host", "a-machine-elsewhere")
    storage.record_heartbeat(dead._trial_id)  # its last beat
    start = time.monotonic()
    assert main(compare_argv(data, tmp_path / "out", tmp_path / "store", "--storage", url, "--study", "shared",
                             *extra, policies="attn", search="2")) == 0
    assert time.monotonic() - start < 120
    trials = optuna.load_study(study_name="shared-attn", storage=url).trials
    assert trials[0].state.name == "FAIL"
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == 2


def test_the_private_heartbeat_call_is_the_one_optuna_has():
    """attnft's one private Optuna call (attnft/compare/heartbeat.py), pinned: this Optuna is one it was checked on,
    and the names it reaches for are there."""
    from optuna.storages import _heartbeat

    from attnft.compare.heartbeat import CHECKED_ON

    version = tuple(int(part) for part in optuna.__version__.split(".")[:2])
    low, high = (tuple(int(p) for p in v.split(".")) for v in CHECKED_ON)
    assert low <= version <= high, f"check attnft/compare/heartbeat.py against Optuna {optuna.__version__}"
    assert callable(_heartbeat.get_heartbeat_thread)
    study = optuna.create_study()
    trial = study.ask()
    assert isinstance(trial._trial_id, int) and study._storage is not None


def test_a_trial_whose_worker_died_before_it_said_whose_it_is_is_failed(data, tmp_path, monkeypatch):
    """Killed between asking for a trial and recording its host and pid (no heartbeat yet either): the trial says no
    owner, and once it is :data:`ORPHAN_S` old the next process fails it and runs the one missing, instead of waiting
    for a heartbeat that never comes."""
    import attnft.compare.study as search
    from attnft.compare.storage import open_storage

    monkeypatch.setattr(search, "ORPHAN_S", 1)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    study = optuna.create_study(study_name="orphan-attn", storage=open_storage(url), direction="maximize")
    with pytest.warns(UserWarning, match="Heartbeat"):
        study.ask()  # and nothing else: the worker is gone
    time.sleep(1.5)
    start = time.monotonic()
    assert main(compare_argv(data, tmp_path / "out", tmp_path / "store", "--storage", url, "--study", "orphan",
                             policies="attn", search="2")) == 0
    assert time.monotonic() - start < 120
    trials = optuna.load_study(study_name="orphan-attn", storage=url).trials
    assert trials[0].state.name == "FAIL" and sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == 2
