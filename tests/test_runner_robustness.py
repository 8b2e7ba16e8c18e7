"""attnft finetune / eval never save a broken adapter, never lose a trained one, and say every user error in one line.

Each refusal: exit code 2, exactly one line on stderr, no traceback, and the store and the output dir
as they were (``_fails_cleanly``). Tiny ViT and colour folders from test_runner.
"""
import contextlib
import errno
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
import warnings

import datasets
import pytest
import torch
from PIL import Image

from attnft.cli import main
from attnft.training.divergence import LossWindow
from attnft.training.processes import new_accelerator
from attnft.training.run_folder import LOCK_FILE, MetricsLog
from full_disk import fill, small_tmpfs  # noqa: F401  (small_tmpfs: a fixture)
from test_runner import (  # noqa: F401  (fixtures)
    _fails_cleanly,
    _snapshot,
    finetune_args,
    one_thread_and_private_caches,
    previous_run,
    subprocess_env,
    tiny,
    write_color_folder,
)


class Unsafe:
    """Any class of ours: loading it would run code of the pickle's choosing."""


def _refuse_constants(text):
    raise ValueError(f"not strict JSON: {text}")


def strict_loads(text: str):
    """json.loads that refuses NaN / Infinity, which Python writes by default and strict readers refuse."""
    return json.loads(text, parse_constant=_refuse_constants)


def adapters_in(store) -> list:
    return sorted(os.listdir(store)) if os.path.isdir(store) else []


def leftovers(root) -> list:
    """Temporary files a failed write could have left behind."""
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".tmp") or ".tmp-" in f]


# ---- 1. non-finite training ---------------------------------------------------------------------

@pytest.mark.parametrize("flag, value", [
    ("--lr", "inf"), ("--lr", "nan"), ("--weight-decay", "inf"), ("--min-lr", "nan"), ("--warmup-epochs", "inf"),
    ("--momentum", "nan"), ("--clip-grad", "inf"), ("--drop-path", "nan"), ("--smoothing", "-inf"),
    ("--mixup", "nan"), ("--crop-pct", "nan"), ("--val-fraction", "nan"),
])
def test_a_float_flag_that_is_not_finite_is_refused_before_anything_runs(previous_run, tmp_path, capsys, flag, value):
    model, data = previous_run
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, f"{flag}={value}", "--overwrite", "--name", "kept"),
                   words=[flag[2:].replace("-", "_"), "finite"], untouched=[tmp_path / "run", tmp_path / "store"])


@pytest.mark.parametrize("argv, words", [
    (["--crop-pct", "0"], ["crop_pct"]), (["--crop-pct", "5"], ["crop_pct"]), (["--hflip", "2"], ["hflip"]),
    (["--scale", "1", "0"], ["scale"]), (["--seed", "-1"], ["seed"]), (["--momentum", "1.5"], ["momentum"]),
    (["--optimizer", "sgd", "--momentum", "0"], ["momentum", "sgd"]), (["--recount", "100000000"], ["recount"]),
    (["--repeated-aug", "100000"], ["repeated_aug"]), (["--weight-decay", "1e300"], ["weight_decay x lr"]),
    (["--lr", "1e31"], ["lr", "at most"]), (["--lr", "1e6"], ["weight_decay x lr"]),
])
def test_out_of_range_values_are_refused_at_parse_time(previous_run, tmp_path, capsys, argv, words):
    model, data = previous_run
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, *argv, "--overwrite", "--name", "kept"),
                   words=words, untouched=[tmp_path / "run", tmp_path / "store"])


def test_a_diverging_run_stops_naming_the_step_saves_no_adapter_and_logs_strict_json(tiny, tmp_path, capsys):
    model, data = tiny
    capsys.readouterr()
    assert main(finetune_args(model, data, tmp_path, "--lr", "1e20", "--weight-decay", "0", "--steps", "4",
                              "--log-every", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnft: error: training diverged") and "\n" not in err, err
    assert "step" in err and "--lr" in err and "lower" in err
    assert adapters_in(tmp_path / "store") == []
    assert not (tmp_path / "run" / "result.json").exists()
    assert not (tmp_path / "run" / LOCK_FILE).exists()  # the lock goes however the run ends
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [strict_loads(line) for line in lines]
    assert any(r.get("loss", 0) is None for r in records)  # the NaN loss, as null


def test_weights_broken_by_the_last_step_are_caught_before_saving(tiny, tmp_path, capsys):
    """The loss of the last step is finite (computed before its update); the update breaks the model."""
    model, data = tiny
    capsys.readouterr()
    assert main(finetune_args(model, data, tmp_path, "--steps", "1", "--lr", "1e30", "--weight-decay", "0")) == 2
    err = capsys.readouterr().err.strip()
    assert "training diverged" in err and "after step 1" in err and "\n" not in err, err
    assert adapters_in(tmp_path / "store") == []
    assert not (tmp_path / "run" / "result.json").exists()


def test_the_window_tracks_a_non_finite_loss_without_reading_the_device():
    """A step reads nothing back from the device: .item(), .tolist() and bool() of a tensor fail inside add()."""
    accelerator = new_accelerator(cpu=True)
    window = LossWindow()
    losses = [torch.tensor(1.0), torch.tensor(float("nan")), torch.tensor(float("inf"))]
    with pytest.MonkeyPatch.context() as patch:
        for method in ("item", "tolist", "__bool__", "__float__", "__int__"):
            patch.setattr(torch.Tensor, method, lambda *a, **k: pytest.fail("a device sync in a training step"))
        for step, loss in enumerate(losses, start=1):
            window.add(loss, torch.tensor([True, False]), 2, step)
    assert window.first_nonfinite_step(accelerator) == 2
    clean = LossWindow()
    clean.add(torch.tensor(0.5), torch.tensor([True]), 1, 1)
    assert clean.first_nonfinite_step(accelerator) is None


def _corrupt_all_images(folder):
    for directory, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(directory, name), "wb") as f:
                f.write(b"not a png")


def test_result_json_and_eval_json_write_null_for_nan(tiny, tmp_path, capsys):
    """No readable eval image: the loss is NaN and the accuracies unknown; both files stay strict JSON."""
    model, data = tiny
    _corrupt_all_images(os.path.join(data, "val"))
    assert main(finetune_args(model, data, tmp_path, "--steps", "1", "--name", "c")) == 0
    printed = capsys.readouterr().out
    assert "no readable eval image" in printed
    result = strict_loads((tmp_path / "run" / "result.json").read_text())
    assert result["final_eval"]["loss"] is None and result["accuracy_after"] is None
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        strict_loads(line)

    assert main(["eval", "--adapter", "c", "--store", str(tmp_path / "store"), "--dataset", data, "--workers", "0",
                 "--no-progress"]) == 0
    report = strict_loads(capsys.readouterr().out)
    assert report["loss"] is None and report["top1"] is None and report["num_samples"] == 0


# ---- 2. full disk, I/O errors --------------------------------------------------------------------

@contextlib.contextmanager
def fsync_fails_under(root, name_part=""):
    """Inside, os.fsync raises ENOSPC for files under ``root`` (whose name holds ``name_part``): the real
    write path of every atomic write here (temporary file, fsync, rename)."""
    real = os.fsync
    root = os.path.realpath(root)

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.startswith(root) and name_part in os.path.basename(target):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", fsync)
        yield


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_leaves_no_temporary(tiny, tmp_path, capsys):
    model, data = tiny
    capsys.readouterr()
    with fsync_fails_under(tmp_path / "run" / "checkpoints"):
        assert main(finetune_args(model, data, tmp_path, "--steps", "3", "--checkpoint-every", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnft: error: no space left on device") and "\n" not in err, err
    assert "checkpoint step_00000001.pt" in err
    assert leftovers(tmp_path / "run") == [] and os.listdir(tmp_path / "run" / "checkpoints") == []
    assert adapters_in(tmp_path / "store") == []
    assert not (tmp_path / "run" / LOCK_FILE).exists()


def test_a_full_store_after_training_keeps_the_adapter_in_the_output_dir_and_says_how_to_import_it(
        tiny, tmp_path, capsys):
    model, data = tiny
    capsys.readouterr()
    with fsync_fails_under(tmp_path / "store"):
        assert main(finetune_args(model, data, tmp_path, "--steps", "2", "--name", "colors")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no space left on device" in err, err
    saved_to = tmp_path / "run" / "colors"
    command = f"attnft adapters import {saved_to} colors --store {tmp_path / 'store'}"
    assert command in err, err
    assert adapters_in(tmp_path / "store") == [] and leftovers(tmp_path / "store") == []
    assert not (tmp_path / "run" / "result.json").exists()

    # space again: the command the message gives imports the trained adapter
    assert main(command.split()[1:]) == 0
    assert main(["adapters", "verify", "colors", "--store", str(tmp_path / "store")]) == 0
    assert main(["eval", "--adapter", "colors", "--store", str(tmp_path / "store"), "--dataset", data,
                 "--workers", "0", "--no-progress"]) == 0


def test_a_failed_result_json_write_says_the_adapter_is_saved(tiny, tmp_path, capsys):
    model, data = tiny
    capsys.readouterr()
    with fsync_fails_under(tmp_path / "run", name_part="result.json"):
        assert main(finetune_args(model, data, tmp_path, "--steps", "1", "--name", "colors")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no space left on device" in err and "result.json" in err, err
    assert "colors is saved" in err
    assert adapters_in(tmp_path / "store") == ["colors"] and leftovers(tmp_path / "run") == []


def test_eval_output_on_a_full_disk_is_one_line_and_leaves_no_temporary(previous_run, tmp_path, capsys):
    _, data = previous_run
    (tmp_path / "out").mkdir()
    with fsync_fails_under(tmp_path / "out"):
        _fails_cleanly(capsys, ["eval", "--adapter", "kept", "--store", str(tmp_path / "store"), "--dataset", data,
                                "--workers", "0", "--output", str(tmp_path / "out" / "eval.json")],
                       words=["no space left on device", "eval.json"], untouched=[tmp_path / "out"])
    assert os.listdir(tmp_path / "out") == []


def test_a_really_full_store_keeps_the_trained_adapter_in_the_output_dir(tiny, tmp_path, capsys, small_tmpfs):
    model, data = tiny
    store = small_tmpfs / "store"
    store.mkdir()
    fill(small_tmpfs, 8192)  # room for the adapter's config, not for its weights
    argv = finetune_args(model, data, tmp_path, "--steps", "2", "--name", "colors")
    argv[argv.index("--store") + 1] = str(store)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no space left on device" in err, err
    assert f"attnft adapters import {tmp_path / 'run' / 'colors'} colors --store {store}" in err
    assert os.listdir(store) == [] and leftovers(small_tmpfs) == []
    os.unlink(small_tmpfs / "filler")
    assert main(["adapters", "import", str(tmp_path / "run" / "colors"), "colors", "--store", str(store)]) == 0


def test_a_really_full_output_dir_is_one_line_and_leaves_no_temporary(tiny, tmp_path, capsys, small_tmpfs):
    model, data = tiny
    fill(small_tmpfs, 64 * 1024)  # the lock, config and metrics fit; a checkpoint (about 200 kB) does not
    argv = finetune_args(model, data, tmp_path, "--steps", "3", "--checkpoint-every", "1")
    argv[argv.index("--output-dir") + 1] = str(small_tmpfs / "run")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnft: error: no space left on device") and "\n" not in err, err
    assert leftovers(small_tmpfs) == [] and adapters_in(tmp_path / "store") == []
    assert not (small_tmpfs / "run" / LOCK_FILE).exists()


# ---- 3. a run owns its output dir ---------------------------------------------------------------

def _write_lock(run_dir, pid: int) -> None:
    import socket

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_FILE).write_text(f"{pid} {socket.gethostname()}\n")


def test_a_second_run_on_a_running_runs_output_dir_is_refused_naming_its_pid(tiny, tmp_path, capsys):
    model, data = tiny
    first = subprocess.Popen(
        [sys.executable, "-m", "attnft", *finetune_args(model, data, tmp_path, "--steps", "100000", "--name", "a")],
        env=subprocess_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (tmp_path / "run" / LOCK_FILE).exists():
            assert first.poll() is None and time.time() < deadline, "the first run did not start"
            time.sleep(0.2)
        assert (tmp_path / "run" / LOCK_FILE).read_text().split()[0] == str(first.pid)
        capsys.readouterr()
        assert main(finetune_args(model, data, tmp_path, "--steps", "1", "--name", "b", "--overwrite")) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"pid {first.pid}" in err and "in use" in err, err
        assert adapters_in(tmp_path / "store") == []
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # killed: its lock is stale and taken over by the next run, which removes it at the end
    assert (tmp_path / "run" / LOCK_FILE).exists()
    assert main(finetune_args(model, data, tmp_path, "--steps", "1", "--name", "b", "--overwrite")) == 0
    assert not (tmp_path / "run" / LOCK_FILE).exists()


def test_a_lock_of_a_live_process_is_refused_before_the_model_is_built(previous_run, tmp_path, capsys):
    model, data = previous_run
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(tmp_path / "run", owner.pid)
        _fails_cleanly(capsys, finetune_args("local-dir:/no/such/model", data, tmp_path, "--overwrite"),
                       words=[f"pid {owner.pid}", "--output-dir"], untouched=[tmp_path / "run", tmp_path / "store"])
    finally:
        owner.kill()
        owner.wait()


def test_a_stale_lock_of_a_dead_process_is_taken_over_and_removed_at_the_end(tiny, tmp_path):
    model, data = tiny
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lock(tmp_path / "run", dead.pid)
    assert main(finetune_args(model, data, tmp_path, "--steps", "1")) == 0
    assert not (tmp_path / "run" / LOCK_FILE).exists()


# ---- 4, 5. one line and exit 2 for everything a user can get wrong -------------------------------

def test_a_huge_resolution_is_refused_before_the_model_is_built(previous_run, tmp_path, capsys):
    model, data = previous_run
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--res", "100000", "--overwrite", "--name", "kept"),
                   words=["100000", "tokens", "--res up to 4096"], untouched=[tmp_path / "run", tmp_path / "store"])


def test_an_unknown_train_interpolation_is_refused_naming_timms(previous_run, tmp_path, capsys):
    model, data = previous_run
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--train-interpolation", "foo", "--overwrite"),
                   words=["train_interpolation", "bicubic", "random", "'foo'"], untouched=[tmp_path / "run"])


def test_the_known_interpolations_are_timms():
    from timm.data.transforms import _str_to_pil_interpolation  # the names str_to_interp_mode takes

    from attnft.training.config import INTERPOLATIONS

    assert set(INTERPOLATIONS) == set(_str_to_pil_interpolation) | {"random"}


def test_a_store_that_is_a_file_is_refused(previous_run, tmp_path, capsys):
    model, data = previous_run
    (tmp_path / "file").write_text("x")
    argv = finetune_args(model, data, tmp_path, "--overwrite")
    argv[argv.index("--store") + 1] = str(tmp_path / "file")
    _fails_cleanly(capsys, argv, words=["is a file"], untouched=[tmp_path / "run", tmp_path / "file"])


def test_a_recipe_that_is_not_utf8_is_refused(previous_run, tmp_path, capsys):
    model, data = previous_run
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("# r\xe9glage\nlr: 1e-4\n".encode("latin-1"))
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--recipe", str(recipe)),
                   words=["UTF-8", "latin1.yaml"], untouched=[tmp_path / "run"])


def test_an_invalid_hub_repo_id_is_refused(previous_run, tmp_path, capsys):
    _, data = previous_run
    _fails_cleanly(capsys, finetune_args("hf-hub:../../x", data, tmp_path, "--overwrite"),
                   words=["hf-hub:../../x", "repo id"], untouched=[tmp_path / "run"])


def test_a_local_dir_with_only_pickled_weights_is_refused_with_how_to_convert(previous_run, tmp_path, capsys):
    import timm
    from timm.models._hub import save_for_hf

    from test_runner import TINY_ARGS

    _, data = previous_run
    folder = tmp_path / "pickled"
    net = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=3, **TINY_ARGS)
    save_for_hf(net, str(folder), model_args=dict(TINY_ARGS, num_classes=3), safe_serialization=False)
    assert sorted(os.listdir(folder)) == ["config.json", "pytorch_model.bin"]
    _fails_cleanly(capsys, finetune_args(f"local-dir:{folder}", data, tmp_path, "--overwrite"),
                   words=["pytorch_model.bin", "never unpickles", "model.safetensors"], untouched=[tmp_path / "run"])


@pytest.mark.parametrize("bad", [9, -1])
def test_a_saved_dataset_with_labels_outside_its_class_names_is_refused_at_load_time(previous_run, tmp_path, capsys,
                                                                                     bad):
    model, _ = previous_run
    image = Image.new("RGB", (32, 32))
    rows = datasets.Dataset.from_dict({"image": [image] * 8, "label": [0, 1, 2, 0, 1, 2, bad, 0]},
                                      features=datasets.Features({"image": datasets.Image(),
                                                                  "label": datasets.Value("int64")}))
    rows = rows.cast(datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])}))
    datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(str(tmp_path / "saved"))
    argv = finetune_args(model, str(tmp_path / "saved"), tmp_path, "--overwrite")
    argv[argv.index("--batch-size") + 1] = "4"
    _fails_cleanly(capsys, argv, words=[f"holds {bad}", "0-2"], untouched=[tmp_path / "run", tmp_path / "store"])


def test_eval_at_another_resolution_than_the_adapters_is_refused(previous_run, tmp_path, capsys):
    _, data = previous_run  # "kept" was trained at 32 px
    _fails_cleanly(capsys, ["eval", "--adapter", "kept", "--store", str(tmp_path / "store"), "--dataset", data,
                            "--res", "48", "--workers", "0"],
                   words=["32 px", "--res"], untouched=[tmp_path / "store"])


def test_eval_output_that_is_a_directory_or_an_existing_file_is_refused_unless_overwrite(previous_run, tmp_path,
                                                                                          capsys):
    _, data = previous_run
    common = ["eval", "--adapter", "kept", "--store", str(tmp_path / "store"), "--dataset", data, "--workers", "0"]
    (tmp_path / "out").mkdir()
    _fails_cleanly(capsys, [*common, "--output", str(tmp_path / "out")], words=["is a directory"],
                   untouched=[tmp_path / "out"])
    (tmp_path / "out" / "eval.json").write_text("keep me")
    _fails_cleanly(capsys, [*common, "--output", str(tmp_path / "out" / "eval.json")], words=["--overwrite"],
                   untouched=[tmp_path / "out"])
    assert main([*common, "--output", str(tmp_path / "out" / "eval.json"), "--overwrite"]) == 0
    assert strict_loads((tmp_path / "out" / "eval.json").read_text())["adapter"] == str(tmp_path / "store" / "kept")


@pytest.fixture
def checkpointed_run(tiny, tmp_path):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "2", "--checkpoint-every", "1",
                              "--no-eval-before")) == 0
    shutil.rmtree(tmp_path / "store")
    return model, data, tmp_path / "run" / "checkpoints"


def test_resume_over_a_truncated_checkpoint_is_one_line_without_torchs_advice(checkpointed_run, tmp_path, capsys):
    model, data, checkpoints = checkpointed_run
    newest = checkpoints / "step_00000002.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    argv = finetune_args(model, data, tmp_path, "--steps", "2", "--checkpoint-every", "1", "--no-eval-before",
                         "--resume")
    _fails_cleanly(capsys, argv, words=["corrupt", "step_00000002.pt", "step_00000001.pt"],
                   untouched=[tmp_path / "run"])
    assert not os.path.exists(tmp_path / "store")


def test_resume_over_a_checkpoint_holding_python_objects_says_unsafe_not_weights_only(checkpointed_run, tmp_path,
                                                                                      capsys):
    model, data, checkpoints = checkpointed_run
    torch.save({"position": Unsafe()}, checkpoints / "step_00000002.pt")  # weights_only refuses the class
    argv = finetune_args(model, data, tmp_path, "--steps", "2", "--checkpoint-every", "1", "--no-eval-before",
                         "--resume")
    before = _snapshot([tmp_path / "run"])
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "corrupt or unsafe" in err and "weights_only" not in err, err
    assert _snapshot([tmp_path / "run"]) == before


@pytest.mark.parametrize("policy", ["attn@99", "lora@7"])
def test_a_policy_naming_blocks_the_model_lacks_is_refused_with_its_block_count(previous_run, tmp_path, capsys,
                                                                                policy):
    model, data = previous_run
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--policy", policy, "--overwrite"),
                   words=[policy, "2 blocks"], untouched=[tmp_path / "run", tmp_path / "store"])


def test_an_auto_augment_policy_timm_cannot_read_is_refused_before_training(previous_run, tmp_path, capsys):
    model, data = previous_run
    _fails_cleanly(capsys, finetune_args("local-dir:/no/such/model", data, tmp_path, "--auto-augment", "rand-zzz"),
                   words=["rand-zzz", "'zzz'"], untouched=[tmp_path / "run"])
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--auto-augment", "nope", "--overwrite"),
                   words=["'nope'"], untouched=[tmp_path / "run"])


def test_streaming_without_steps_and_an_empty_name_are_refused_at_parse_time(previous_run, tmp_path, capsys):
    _, data = previous_run
    nowhere = "local-dir:/no/such/model"  # never reached: the flags are refused first
    _fails_cleanly(capsys, finetune_args(nowhere, data, tmp_path, "--streaming"), words=["--streaming", "--steps"],
                   untouched=[tmp_path / "run"])
    _fails_cleanly(capsys, finetune_args(nowhere, data, tmp_path, "--name", ""), words=["name"],
                   untouched=[tmp_path / "run"])


def test_train_and_val_folders_with_other_classes_are_refused_naming_one(previous_run, tmp_path, capsys):
    model, _ = previous_run
    data = write_color_folder(tmp_path / "uneven", train_per_class=4, eval_per_class=2)
    shutil.copytree(os.path.join(data, "train", "red"), os.path.join(data, "train", "grey"))
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--overwrite"),
                   words=["'grey'", "train", "validation"], untouched=[tmp_path / "run", tmp_path / "store"])


# ---- 6. messages ----------------------------------------------------------------------------------

def test_no_progress_quiets_datasets_bars_and_an_error_is_the_only_line(tiny, tmp_path, capsys):
    model, data = tiny
    datasets.enable_progress_bars()  # as a user has them (the autouse fixture turns them off)
    assert main(finetune_args(model, data, tmp_path, "--steps", "1")) == 0  # finetune_args: --no-progress
    err = capsys.readouterr().err
    assert "Generating" not in err and "Downloading" not in err, err
    uneven = write_color_folder(tmp_path / "uneven", train_per_class=4, eval_per_class=2)
    shutil.rmtree(os.path.join(uneven, "val", "red"))
    argv = [a for a in finetune_args(model, uneven, tmp_path / "b") if a != "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnft: error:") and "\n" not in err, err


def test_a_pickle_checkpoint_is_refused_without_torch_warnings(previous_run, tmp_path, capsys):
    model, data = previous_run
    with open(tmp_path / "weights.pkl", "wb") as f:
        pickle.dump({"pos_embed": torch.zeros(1, 17, 32)}, f, protocol=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--checkpoint", str(tmp_path / "weights.pkl"),
                                             "--overwrite"),
                       words=["weights.pkl"], untouched=[tmp_path / "run", tmp_path / "store"])
    assert not [w for w in caught if "pickle" in str(w.message)], [str(w.message) for w in caught]


def test_a_checkpoint_that_is_a_directory_says_so(previous_run, tmp_path, capsys):
    model, data = previous_run
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--checkpoint", str(tmp_path / "model"),
                                         "--overwrite"),
                   words=["is a directory, not a file", "model.safetensors"], untouched=[tmp_path / "run"])


def test_a_single_class_folder_is_reported_as_one_class(previous_run, tmp_path, capsys):
    model, _ = previous_run
    data = write_color_folder(tmp_path / "one", classes=("red",), train_per_class=8, eval_per_class=2)
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--overwrite"), words=["only one class", "'red'"],
                   untouched=[tmp_path / "run"])


def test_a_file_name_that_is_not_utf8_is_named_with_the_fix(previous_run, tmp_path, capsys):
    model, _ = previous_run
    data = write_color_folder(tmp_path / "names", train_per_class=4, eval_per_class=2)
    bad = os.fsencode(os.path.join(data, "train", "red")) + b"/caf\xe9.png"
    shutil.copy(os.path.join(data, "train", "red", "0.png"), bad)
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--overwrite"),
                   words=["caf\\xe9.png", "not UTF-8", "rename"], untouched=[tmp_path / "run"])


def test_metrics_read_back_after_a_run_are_strict_json(tiny, tmp_path):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "2", "--log-every", "1")) == 0
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        strict_loads(line)
    strict_loads((tmp_path / "run" / "result.json").read_text())
    assert len(MetricsLog(tmp_path / "run" / "metrics.jsonl").read()) == 4  # before, 2 steps, final


def test_loras_new_weights_follow_seed_even_when_the_head_is_kept(tiny, tmp_path):  # noqa: F811
    """--seed is the seed of initialisation: with the base's head kept (--no-new-head), LoRA's random A matrices
    are drawn from it, not from whatever the process drew before (IA3 starts at ones, nothing random)."""
    from attnft.training.config import FinetuneConfig
    from attnft.training.plan import check_run

    model, data = tiny

    def new_weights(seed: int) -> dict:
        cfg = FinetuneConfig(model=model, dataset=data, policy="lora:r=2", new_head=False, seed=seed, workers=0,
                             batch_size=8, store=str(tmp_path / "store"), output_dir=str(tmp_path / "run"))
        with contextlib.ExitStack() as on_exit:
            plan = check_run(cfg, on_exit)
            return {n: p.detach().clone() for n, p in plan.applied.model.named_parameters()
                    if p.requires_grad and "head" not in n}

    torch.rand(7)  # draws before the run do not matter
    first, again, other = new_weights(0), new_weights(0), new_weights(1)
    assert first and all(torch.equal(first[n], again[n]) for n in first)
    assert any(not torch.equal(first[n], other[n]) for n in first)
    assert not (tmp_path / "store").exists() and not (tmp_path / "run").exists()  # the checks write nothing
