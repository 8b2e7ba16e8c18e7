"""``attnft compare`` against what a user can get wrong, or leave behind: a password, leftovers, changed data,
folders inside folders, foreign studies, flags that do nothing, a comparison killed at the wrong moment.

Real runs of the bundled 28 px model on a small folder of real Fashion-MNIST images (tests/test_compare.py's), real
SQLite and PostgreSQL studies.
"""
import re
import subprocess
import sys

import pytest

from attnft.cli import main
from test_runner import _fails_cleanly
from test_compare import compare_argv, data, fashion_folder  # noqa: F401  (data: the module's image folder, a fixture)

optuna = pytest.importorskip("optuna")


def _files(*roots):
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


def test_the_storage_password_is_written_and_printed_nowhere(data, tmp_path, postgres_url):  # noqa: F811
    url = postgres_url.replace("postgresql://postgres@", "postgresql://postgres:secretpw@")  # trust: any password
    out, store = tmp_path / "out", tmp_path / "store"
    argv = [sys.executable, "-m", "attnft", *compare_argv(data, out, store, "--storage", url, "--study", "masked",
                                                          policies="head", search="1")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "secretpw" not in done.stdout + done.stderr
    assert "secretpw" not in "".join(map(str, _files(out, store)))
    for path in _files(out, store):
        assert b"secretpw" not in path.read_bytes(), path
    assert "postgres:***@127.0.0.1" in (out / "compare.md").read_text()


def test_a_storage_url_the_database_cannot_parse_is_refused_without_its_password(data, tmp_path, capsys):  # noqa: F811
    argv = compare_argv(data, tmp_path / "out", tmp_path / "store", "--storage",
                        "postgresql://bob:secretpw@127.0.0.1:noport/db", policies="head", search="1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "secretpw" not in err and "bob:***@127.0.0.1:noport" in err
    assert not (tmp_path / "out").exists()


def test_a_search_keeps_no_adapter_of_its_trials(data, tmp_path):  # noqa: F811
    """The study keeps the settings a final run retrains: a trial's adapter (as large as the policy's trained weights,
    the whole model under full) is read by nothing, and goes when its trial ends."""
    out, store = tmp_path / "out", tmp_path / "store"
    assert main(compare_argv(data, out, store, "--pruner", "none", policies="full", search="3")) == 0
    assert len(list((out / "trials" / "full").glob("trial-*/result.json"))) == 3
    assert _files(out / "trials" / "adapters") == []
    assert [p.name for p in store.iterdir()] == ["compare-clothes-full"]


def test_a_dataset_whose_files_changed_is_another_study_and_another_comparison(capsys, tmp_path):
    """A class folder added between two runs: the study (and the compare folder) hold trials of 3 classes, and a
    comparison of 4 is refused in one line before anything is written, not mixed into them."""
    clothes = fashion_folder(tmp_path / "clothes", train=10, test=5)
    out, store = tmp_path / "out", tmp_path / "store"
    assert main(compare_argv(clothes, out, store, "--batch-size", "8", policies="head", search="1")) == 0
    fashion_folder(clothes, classes=(2,), train=10, test=5)  # a fourth class
    _fails_cleanly(capsys, compare_argv(clothes, out, store, "--batch-size", "8", policies="head", search="2"),
                   words=["holds a comparison of data_files '45 files", "not '60 files"], untouched=[tmp_path])
    # the study alone, from another compare folder
    _fails_cleanly(capsys, compare_argv(clothes, tmp_path / "out2", store, "--batch-size", "8", "--storage",
                                        f"sqlite:///{out / 'study.db'}", "--study", "attnft-compare-clothes",
                                        policies="head", search="2"),
                   words=["holds trials of data_files '45 files"], untouched=[tmp_path])


def test_the_data_fingerprint_is_the_files_whatever_the_path_and_not_their_order(tmp_path):
    import shutil

    from attnft.data import data_fingerprint

    clothes = fashion_folder(tmp_path / "clothes", train=3, test=2)
    copy = shutil.copytree(clothes, tmp_path / "elsewhere" / "copy")
    assert data_fingerprint(str(clothes), None) == data_fingerprint(None, str(copy)) == data_fingerprint(f"{copy}/", None)
    assert data_fingerprint(str(clothes), None).startswith("15 files, sha256 ")
    (copy / "train" / "Trouser" / "new.png").write_bytes((copy / "train" / "Trouser").iterdir().__next__().read_bytes())
    assert data_fingerprint(str(copy), None) != data_fingerprint(str(clothes), None)
    assert data_fingerprint("fashion-mnist", None) is None and data_fingerprint("owner/name", None) is None


@pytest.mark.parametrize("where", ["output", "store", "data in store"])
def test_nothing_is_written_inside_the_dataset_folder_nor_the_dataset_read_from_the_store(capsys, tmp_path, where):
    """compare.png in the dataset folder would be an image of a new class the next time: an output dir or a store
    inside it is refused (and a dataset inside the store), by compare and finetune alike, before anything is
    written."""
    import shutil

    store = tmp_path / "store"
    clothes = fashion_folder(tmp_path / "clothes", train=10, test=5)
    out = tmp_path / "out"
    if where == "output":
        out = clothes / "report"
    elif where == "store":
        store = clothes / "train" / "adapters"
    else:
        clothes = shutil.copytree(clothes, store / "clothes")
    flag, words = {"output": ("--output-dir", "lies inside the dataset folder"),
                   "store": ("--store", "lies inside the dataset folder"),
                   "data in store": ("--dataset", "lies inside the adapter store")}[where]
    argv = compare_argv(clothes, out, store, "--batch-size", "8", policies="head", search=None)
    _fails_cleanly(capsys, argv, words=[flag, words], untouched=[tmp_path])
    finetune = ["finetune", *argv[argv.index("--dataset"):argv.index("--policies")], "--output-dir", str(out / "run"),
                "--store", str(store), "--model", "vit_fmnist_patch4_28", "--steps", "1", "--batch-size", "8",
                "--workers", "0", "--no-progress"]
    _fails_cleanly(capsys, finetune, words=[flag, words], untouched=[tmp_path])
    assert not out.exists() and (where == "data in store" or not store.exists())


@pytest.mark.parametrize("kind, words", [
    ("minimize", ["one objective to minimize"]),
    ("two objectives", ["2 objectives"]),
    ("other parameters", ["its trials draw momentum, x", "attnft's draw lr and weight_decay"]),
])
def test_a_study_of_another_tool_is_refused_before_anything_is_written_into_it(capsys, data, tmp_path, kind,  # noqa: F811
                                                                              words):
    """A study under --study that is no search of attnft's (another direction, several objectives, trials of other
    parameters) is refused in one line, nothing written into it or the compare folder, by a worker or the default
    SQLite study of a compare folder alike."""
    url = f"sqlite:///{tmp_path / 'foreign.db'}"
    directions = {"minimize": ["minimize"], "two objectives": ["maximize", "maximize"]}.get(kind, ["maximize"])
    study = optuna.create_study(study_name="foreign-head", storage=url, directions=directions)
    if kind == "other parameters":
        study.optimize(lambda t: t.suggest_float("x", 0, 1) + t.suggest_float("momentum", 0, 1), n_trials=1)
    for extra in (["--search-only"], []):
        argv = compare_argv(data, tmp_path / "out", tmp_path / "store", "--storage", url, "--study", "foreign", *extra,
                            policies="head", search="1")
        _fails_cleanly(capsys, argv, words=["the study foreign-head in sqlite:///", "is no search of attnft compare",
                                            *words], untouched=[tmp_path])
    assert not (tmp_path / "out").exists()
    # the same study as the default one of a compare folder
    folder = tmp_path / "folder"
    assert main(compare_argv(data, folder, tmp_path / "store", policies="head", search=None)) == 0
    optuna.copy_study(from_study_name="foreign-head", from_storage=url, to_storage=f"sqlite:///{folder / 'study.db'}",
                      to_study_name="attnft-compare-clothes-head")
    _fails_cleanly(capsys, compare_argv(data, folder, tmp_path / "store", policies="head", search="1"),
                   words=["the study attnft-compare-clothes-head", "is no search of attnft compare", *words],
                   untouched=[tmp_path])


@pytest.mark.parametrize("extra, search, words", [
    (["--storage", "sqlite:///x.db"], None, ["--storage is for the search: pass --search N"]),
    (["--study", "s"], None, ["--study is for the search"]),
    (["--pruner", "none"], None, ["--pruner is for the search"]),
    (["--holdout", "0.3"], None, ["--holdout is for the search"]),
    (["--search-seed", "0"], None, ["--search-seed is for the search"]),
    (["--holdout", "0.3", "--study", "s"], None, ["--holdout, --study are for the search"]),
    (["--policies", "attn,,head"], "1", ["--policies has an empty item: 'attn,,head'"]),
    (["--policies", "attn,head,"], "1", ["--policies has an empty item"]),
    (["--policies", "lora:r=8,lora:r=08"], "1", ["lora:r=8 and lora:r=08 are the same policy"]),
    (["--policies", "lora,lora:r=8"], "1", ["lora and lora:r=8 are the same policy"]),
    (["--policies", "lora:r=16,alpha=32,lora:alpha=32,r=16"], "1", ["are the same policy"]),
    (["--policies", "attn+norm,attn+norm+norm"], "1", ["are the same policy"]),
    (["--search-seed", "-5"], "2", ["--search-seed must be from 0 to 4294967295, got -5"]),
    (["--storage", "just-a-file.db"], "2", ["--storage must be a database URL"]),
])
def test_what_a_comparison_would_ignore_or_run_twice_is_refused_before_anything_is_written(capsys, data, tmp_path,  # noqa: F811
                                                                                           extra, search, words):
    argv = compare_argv(data, tmp_path / "out", tmp_path / "store", *extra, policies="head", search=search)
    _fails_cleanly(capsys, argv, words=words, untouched=[tmp_path])
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists()


@pytest.mark.parametrize("store", ["out/store", "out/final/head"])
def test_a_store_inside_the_compare_folder_is_refused_before_anything_runs(capsys, data, tmp_path, store):  # noqa: F811
    argv = compare_argv(data, tmp_path / "out", tmp_path / store, policies="head", search="1")
    _fails_cleanly(capsys, argv, words=["--store", "lies inside the compare folder"], untouched=[tmp_path])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("values, words", [
    (dict(seeds=2.5), "seeds must be int, got 2.5"),
    (dict(seeds=True), "seeds must be int, got True"),
    (dict(search=2.5), "search must be int, got 2.5"),
    (dict(search=2, search_seed=-1), "--search-seed must be from 0"),
    (dict(search=2, storage=123), "--storage must be a database URL"),
    (dict(search=2, holdout="a lot"), "holdout must be float"),
    (dict(search=2, search_only="maybe"), "search_only must be"),
    (dict(policies=["attn"]), "policies must be str"),
])
def test_a_compare_config_built_from_python_checks_its_types_as_finetunes_does(values, words):
    from attnft.compare.config import CompareConfig
    from attnft.core.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(words)):
        CompareConfig(**values)


def test_the_search_flags_take_their_defaults_with_a_search_only():
    from attnft.compare.config import CompareConfig

    searched = CompareConfig(search=2)
    assert (searched.holdout, searched.pruner, searched.search_seed) == (0.2, "median", 0)
    assert CompareConfig(search=2.0, seeds="3").search == 2 and CompareConfig(seeds="3").seeds == 3
    plain = CompareConfig()
    assert (plain.holdout, plain.pruner, plain.search_seed) == (None, None, None)


def test_a_comparison_stopped_after_its_adapter_reached_the_store_resumes_and_replaces_it(capsys, data,  # noqa: F811
                                                                                          tmp_path):
    """The final run saved its adapter, then the comparison was killed before it recorded the run (simulated: the
    run's result.json and compare_run.json gone, as a kill between the save and them leaves it). The adapter names
    the run folder that trained it (a hash of its path): the resumed comparison knows it for its own and replaces it
    without --overwrite; another compare folder's comparison of the same task is still refused it."""
    out, store = tmp_path / "out", tmp_path / "store"
    argv = compare_argv(data, out, store, policies="head", search=None)
    assert main(argv) == 0
    run, adapter = out / "final" / "head" / "seed-0", store / "compare-clothes-head" / "adapter_config.json"
    for name in ("result.json", "compare_run.json"):
        (run / name).unlink()
    stamp = adapter.stat().st_mtime_ns
    _fails_cleanly(capsys, compare_argv(data, tmp_path / "other", store, policies="head", search=None),
                   words=["an adapter named 'compare-clothes-head' exists", "--overwrite"], untouched=[tmp_path])
    assert main(argv) == 0
    assert (run / "compare_run.json").is_file() and adapter.stat().st_mtime_ns != stamp
    assert [p.name for p in store.iterdir()] == ["compare-clothes-head"]
