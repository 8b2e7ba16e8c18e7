"""``attnft compare`` on a real full disk (a small tmpfs, tests/full_disk.py) under its study's database, its compare
folder, its store: one line naming where and what to free, exit 2, nothing half-written, and once there is space
again a rerun resumes, the trials and runs that finished kept. The tiniest comparison: the head, 1 or 2 trials."""
import json
import os

import pytest

import attnft.training.runner
from attnft.cli import main
from full_disk import fill, small_tmpfs  # noqa: F401  (small_tmpfs: a fixture)
from test_compare import compare_argv, fashion_folder
from test_runner import _fails_cleanly

optuna = pytest.importorskip("optuna")

FREE_IT = "free some space there and run the comparison again (it resumes where it stopped"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return fashion_folder(tmp_path_factory.mktemp("data") / "clothes", train=10, test=5)


def _argv(data, out, store, *extra, search="1"):
    return compare_argv(data, out, store, "--batch-size", "8", *extra, policies="head", search=search)


def _one_line(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnft: error: no space left on device") and "\n" not in err, err
    assert FREE_IT in err, err
    return err


def _temporaries(root) -> list:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if ".tmp" in f or f.endswith("-journal")]


def _states(url: str, name: str = "attnft-compare-clothes-head") -> list:
    return [t.state.name for t in optuna.load_study(study_name=name, storage=url).trials]


def test_a_study_database_that_fills_at_study_tell_stops_in_one_line_and_the_rerun_runs_only_the_trial_lost(
        data, tmp_path, small_tmpfs, monkeypatch, capsys):
    """The disk under the study fills while the second trial trains: its result cannot be told. One line naming the
    database; the study as it was (the first trial finished, the second running); with space again, the rerun fails
    the trial whose worker stopped, runs one in its place and never runs the finished one again."""
    url = f"sqlite:///{small_tmpfs / 'study.db'}"
    argv = _argv(data, tmp_path / "out", tmp_path / "store", "--storage", url, "--search-only", search="2")
    real, trained = attnft.training.runner.finetune, []

    def finetune_then_the_disk_fills(cfg, **kwargs):
        result = real(cfg, **kwargs)
        trained.append(cfg.output_dir)
        if len(trained) == 2:
            fill(small_tmpfs, 0)
        return result

    monkeypatch.setattr(attnft.training.runner, "finetune", finetune_then_the_disk_fills)
    err = _one_line(capsys, argv)
    assert f"writing the study database {url}" in err
    assert _states(url) == ["COMPLETE", "RUNNING"] and _temporaries(small_tmpfs) == []
    first = tmp_path / "out" / "trials" / "head" / "trial-000" / "result.json"
    finished = first.stat().st_mtime_ns

    os.unlink(small_tmpfs / "filler")
    assert main(argv) == 0
    assert _states(url) == ["COMPLETE", "FAIL", "COMPLETE"] and len(trained) == 3
    assert first.stat().st_mtime_ns == finished


def test_a_full_compare_folder_leaves_no_half_made_study_and_the_rerun_runs(data, tmp_path, small_tmpfs, capsys):
    """Room for the folder's marker, not for the SQLite study's tables: the study file is removed (half a schema would
    read as another program's tables), and the comparison runs once there is space."""
    out = small_tmpfs / "out"
    fill(small_tmpfs, 48 * 1024)
    err = _one_line(capsys, _argv(data, out, tmp_path / "store", "--search-only"))
    assert f"writing the study database sqlite:///{out / 'study.db'}" in err
    assert sorted(os.listdir(out)) == ["compare_config.json"] and _temporaries(small_tmpfs) == []

    os.unlink(small_tmpfs / "filler")
    assert main(_argv(data, out, tmp_path / "store", "--search-only")) == 0
    assert _states(f"sqlite:///{out / 'study.db'}") == ["COMPLETE"]


def test_a_full_store_is_refused_before_anything_is_written(data, tmp_path, small_tmpfs, capsys):
    store = small_tmpfs / "store"
    store.mkdir()
    fill(small_tmpfs, 0)
    _fails_cleanly(capsys, _argv(data, tmp_path / "out", store, search=None),
                   words=[f"no space left on device writing adapter compare-clothes-head to {store}", FREE_IT],
                   untouched=[tmp_path])
    assert not (tmp_path / "out").exists()


def _report_of(folder) -> dict:
    return {name: (folder / name).read_bytes() for name in ("compare.md", "compare.json", "compare.png")
            if (folder / name).exists()}


def test_the_report_is_written_whole_or_not_at_all(tmp_path, small_tmpfs):
    """Room for compare.md and compare.json, not compare.png: none of them is written, and a report there before is
    left as it was (the issue's run wrote the md and the json, then failed on the picture)."""
    from attnft.compare.report import write_report
    from attnft.core.errors import DiskFullError

    row = {"policy": "head", "top1_mean": 80.0, "top1_std": 0.0, "top1": [80.0], "seeds": [0], "val_top1": None,
           "chosen_by": "the policy's defaults", "lr": 1e-3, "weight_decay": 0.05, "trials": None,
           "trainable_params": 195, "total_params": 100_000, "trainable_share": 0.002, "adapter_mb": 0.01,
           "full_checkpoint_mb": 0.4, "step_s": 0.02, "peak_rss_mb": 900.0, "wall_s": 6.0, "adapter": "a",
           "store": "s"}
    header = {"task": "clothes", "model": "vit_fmnist_patch4_28", "what": "a test", "command": "attnft compare"}
    fill(small_tmpfs, 16 * 1024)
    with pytest.raises(DiskFullError, match=r"no space left on device writing the report \(compare.png\) to "):
        write_report(small_tmpfs, [row], header)
    assert _report_of(small_tmpfs) == {} and _temporaries(small_tmpfs) == []

    os.unlink(small_tmpfs / "filler")
    write_report(small_tmpfs, [row], header)
    before = _report_of(small_tmpfs)
    assert json.loads(before["compare.json"])["best"] == "head" and before["compare.png"][:4] == b"\x89PNG"
    fill(small_tmpfs, 16 * 1024)
    with pytest.raises(DiskFullError):
        write_report(small_tmpfs, [dict(row, top1_mean=90.0)], header)
    assert _report_of(small_tmpfs) == before and _temporaries(small_tmpfs) == []
