"""The store when things go wrong: broken tensors, full or read-only disks, symlinks, killed writers, closed pipes.

Every failure is one line (exit code 2 from the CLI), nothing broken is saved, nothing is lost, and
nothing is left behind. Disk failures are tested on a real 2 MiB tmpfs where the tests may mount
one (as root), and by making the real write path's fsync fail everywhere else.
"""
import copy
import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnft.core import files as files_module
from attnft.core.files import CONFIG_FILE, WEIGHTS_FILE
from attnft.methods.freeze.load import load_adapter
from attnft.methods.freeze.save import save_adapter
from attnft.cli import main
from attnft.core.errors import AdapterError, BaseMismatchError, StoreError
from attnft.adapters.merge import export_adapter
from attnft.adapters.store import STALE_AFTER_S, AdapterStore
from test_store import trained as train_tiny
from tiny_models import tiny_model

REPO = Path(__file__).resolve().parents[1]
DEAD_PID = 999_999_999  # above any kernel's pid_max: never a live process


@pytest.fixture(scope="module")
def trained():
    """A tiny ViT fine-tuned one step under ``attn`` with 3 classes: (model, report, snapshot, base_state)."""
    torch.manual_seed(0)
    return train_tiny(3)


@pytest.fixture
def store(tmp_path, trained):
    model, report, snapshot, _ = trained
    store = AdapterStore(tmp_path / "store")
    store.save("cars", model, report, snapshot)
    return store


@pytest.fixture(scope="module")
def peft_trained():
    """A tiny ViT with 4 classes wrapped by lora: (peft_model, report)."""
    from attnft.methods.peft.model import apply_peft_policy

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft: a timm model has no hub config
        return apply_peft_policy(tiny_model("vit", num_classes=4), "lora:r=4")


def save_peft(store, name, peft_model, report, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return store.save(name, peft_model, report, **kwargs)


@pytest.fixture
def small_disk(tmp_path):
    """A real 2 MiB file system (tmpfs) mounted for the test; skipped where mounting is not allowed."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until about ``leave`` bytes are free."""
    free = shutil.disk_usage(disk).free
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(free - leave, 0))


def remount_read_only(disk: Path) -> None:
    result = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot remount read-only: {result.stderr.strip()}")


def attnft(capsys, *argv):
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(result, *words):
    code, out, err = result
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnft: error:"), err
    for word in words:
        assert word in lines[0], lines[0]


def tree(root: Path) -> dict:
    """Every entry under ``root`` (hidden ones too) with its bytes, or the target of a symlink."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def rewrite_weights(folder: Path, change) -> None:
    """Apply ``change(tensors)`` to an adapter's weights and update its config's size and sha256, as a forger would."""
    weights = folder / WEIGHTS_FILE
    tensors = load_file(weights)
    change(tensors)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    edit_config(folder, weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest(), weights_bytes=weights.stat().st_size)


def edit_config(folder: Path, file: str = CONFIG_FILE, **changes) -> None:
    config = json.loads((folder / file).read_text())
    config.update(changes)
    (folder / file).write_text(json.dumps(config))


def with_nan(model, value=math.nan):
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.blocks[1].attn.proj.weight[0, :3] = value
    return broken


# --- 1. a broken adapter is never saved, and verify finds one -------------------------------


@pytest.mark.parametrize("mode", ["exact", "delta"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_save_refuses_a_nonfinite_tensor_naming_it_and_writes_nothing(tmp_path, trained, mode, value):
    model, report, snapshot, _ = trained
    store = AdapterStore(tmp_path / "store")
    with pytest.raises(AdapterError, match=r"blocks\.1\.attn\.proj\.weight holds 3 NaN/inf values"):
        store.save("cars", with_nan(model, value), report, snapshot, mode=mode)
    assert tree(tmp_path / "store") == {}


def test_save_of_a_nonfinite_adapter_over_an_existing_one_keeps_the_old(store, trained):
    model, report, snapshot, _ = trained
    before = tree(store.root)
    with pytest.raises(AdapterError, match="NaN"):
        store.save("cars", with_nan(model), report, snapshot, overwrite=True)
    assert tree(store.root) == before


def test_peft_save_refuses_a_nonfinite_tensor_and_writes_nothing(tmp_path, peft_trained):
    peft_model, report = peft_trained
    broken = copy.deepcopy(peft_model)
    name = next(n for n, p in broken.named_parameters() if "lora_A" in n)
    with torch.no_grad():
        broken.get_parameter(name)[0, 0] = math.nan
    store = AdapterStore(tmp_path / "store")
    with pytest.raises(AdapterError, match="lora_A.weight holds 1 NaN/inf"):
        save_peft(store, "cars-lora", broken, report)
    assert tree(tmp_path / "store") == {}


def test_verify_reports_a_nonfinite_tensor_by_name(capsys, store):
    rewrite_weights(store.path("cars"), lambda t: t["blocks.0.attn.qkv.weight"].view(-1)[:2].fill_(math.inf))
    with pytest.raises(AdapterError, match=r"blocks\.0\.attn\.qkv\.weight holds 2 NaN/inf"):
        store.verify("cars")
    assert_one_line_error(attnft(capsys, "adapters", "verify", "cars", "--store", store.root), "blocks.0.attn.qkv.weight", "NaN")
    with pytest.raises(AdapterError, match="NaN"):  # loading reads through the same checks
        store.read("cars")


def test_import_refuses_a_folder_with_a_nonfinite_tensor(store, tmp_path):
    shutil.copytree(store.path("cars"), tmp_path / "download")
    rewrite_weights(tmp_path / "download", lambda t: t["head.weight"].view(-1)[:1].fill_(math.nan))
    before = tree(store.root)
    with pytest.raises(AdapterError, match="head.weight holds 1 NaN/inf"):
        store.import_folder(tmp_path / "download", "pets")
    assert tree(store.root) == before


def test_verify_fails_a_config_whose_num_classes_was_edited(capsys, store):
    edit_config(store.path("cars"), num_classes=1000)
    result = attnft(capsys, "adapters", "verify", "cars", "--store", store.root)
    assert_one_line_error(result, "1000 classes", "head.weight has 3 rows")


def test_verify_fails_a_config_whose_label_names_do_not_match_its_classes(store):
    edit_config(store.path("cars"), label_names=["a", "b"])
    with pytest.raises(AdapterError, match="2 label names for 3 classes"):
        store.verify("cars")


def test_verify_fails_a_config_whose_tensor_shape_was_edited(store):
    config = json.loads((store.path("cars") / CONFIG_FILE).read_text())
    config["tensors"]["blocks.0.attn.proj.weight"]["shape"] = [32, 16]
    (store.path("cars") / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(AdapterError, match=r"blocks\.0\.attn\.proj\.weight is F32\[32, 32\], its config says float32\[32, 16\]"):
        store.verify("cars")


def test_verify_fails_a_config_that_does_not_list_every_stored_tensor(store):
    config = json.loads((store.path("cars") / CONFIG_FILE).read_text())
    del config["tensors"]["blocks.1.attn.qkv.bias"]
    (store.path("cars") / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(AdapterError, match=r"extra \['blocks\.1\.attn\.qkv\.bias'\]"):
        store.verify("cars")


def test_verify_fails_stray_bytes_after_the_tensors(store):
    weights = store.path("cars") / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes() + b"\0" * 16)
    edit_config(store.path("cars"), weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest(), weights_bytes=weights.stat().st_size)
    with pytest.raises(AdapterError, match="corrupted header .*not fully covered"):
        store.verify("cars")


def test_verify_of_a_peft_adapter_checks_classes_and_values(tmp_path, peft_trained):
    peft_model, report = peft_trained
    store = AdapterStore(tmp_path / "store")
    save_peft(store, "a", peft_model, report)
    save_peft(store, "b", peft_model, report)
    store.verify("a")
    edit_config(store.path("a"), "attnft.json", num_classes=1000)
    with pytest.raises(AdapterError, match="1000 classes, but the stored head head.weight has 4 rows"):
        store.verify("a")

    def nan_head(tensors):
        tensors["base_model.model.head.bias"][0] = math.nan

    weights = store.path("b") / WEIGHTS_FILE
    tensors = load_file(weights)
    nan_head(tensors)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    edit_config(store.path("b"), "attnft.json", weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest(), weights_bytes=weights.stat().st_size)
    with pytest.raises(AdapterError, match="head.bias holds 1 NaN/inf"):
        store.verify("b")


# --- 2. full disks and other I/O failures ----------------------------------------------------


def _fail_fsync(code):
    def fsync(fd):
        raise OSError(code, os.strerror(code))

    return fsync


IO_FAILURES = [(errno.ENOSPC, "no space left on device"), (errno.EACCES, "permission denied"), (errno.EROFS, "read-only file system")]


@pytest.mark.parametrize("code, reason", IO_FAILURES)
def test_an_io_failure_on_save_is_one_store_error_and_the_store_is_unchanged(store, trained, monkeypatch, code, reason):
    model, report, snapshot, _ = trained
    before = tree(store.root)
    monkeypatch.setattr(os, "fsync", _fail_fsync(code))
    with pytest.raises(StoreError, match=f"^{reason} writing adapter cars to {re.escape(str(store.root))}$"):
        store.save("cars", model, report, snapshot, mode="delta", overwrite=True)
    with pytest.raises(StoreError, match=f"^{reason} writing adapter boats to "):
        store.save("boats", model, report, snapshot)
    assert tree(store.root) == before  # no .tmp-* left, the old adapter intact


def test_a_full_disk_inside_safetensors_is_one_store_error(store, trained, monkeypatch):
    # safetensors writes from Rust and reports the OSError as text; the store reads the errno out of it
    from safetensors import SafetensorError

    def save_file_on_a_full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    model, report, snapshot, _ = trained
    before = tree(store.root)
    monkeypatch.setattr("safetensors.torch.save_file", save_file_on_a_full_disk)
    with pytest.raises(StoreError, match="^no space left on device writing adapter cars to"):
        store.save("cars", model, report, snapshot, overwrite=True)
    assert tree(store.root) == before


def test_an_io_failure_on_cli_import_is_one_line_exit_2_and_copies_nothing(capsys, store, monkeypatch):
    before = tree(store.root)
    monkeypatch.setattr(os, "fsync", _fail_fsync(errno.ENOSPC))
    result = attnft(capsys, "adapters", "import", store.path("cars"), "pets", "--store", store.root)
    assert_one_line_error(result, f"no space left on device writing adapter pets to {store.root}")
    assert tree(store.root) == before


def test_an_io_failure_on_cli_export_is_one_line_exit_2_and_leaves_nothing(capsys, store, trained, tmp_path, monkeypatch):
    save_file(trained[3], str(tmp_path / "base.safetensors"))
    (tmp_path / "exports").mkdir()
    monkeypatch.setattr(os, "fsync", _fail_fsync(errno.ENOSPC))
    result = attnft(
        capsys, "adapters", "export", "cars", "--out", tmp_path / "exports" / "merged",
        "--checkpoint", tmp_path / "base.safetensors", "--store", store.root,
    )
    assert_one_line_error(result, f"no space left on device writing export merged to {tmp_path / 'exports'}")
    assert list((tmp_path / "exports").iterdir()) == []


def test_an_io_failure_on_delete_is_one_line_and_keeps_the_adapter(capsys, store, monkeypatch):
    def renameat2(src, dst, flags):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(dst))

    before = tree(store.root)
    monkeypatch.setattr(files_module, "_renameat2", renameat2)
    result = attnft(capsys, "adapters", "delete", "cars", "--store", store.root)
    assert_one_line_error(result, f"permission denied deleting adapter cars from {store.root}")
    assert tree(store.root) == before


def test_a_full_real_disk_refuses_save_import_and_export_and_leaves_it_unchanged(capsys, small_disk, trained, tmp_path):
    model, report, snapshot, base_state = trained
    store = AdapterStore(small_disk / "store")
    store.save("cars", model, report, snapshot)
    outside = AdapterStore(tmp_path / "outside")
    outside.save("big", model, report, snapshot)
    save_file(base_state, str(tmp_path / "base.safetensors"))
    fill(small_disk, leave=8192)  # room for the check before training, not for an adapter
    assert store.check_writable("cars", overwrite=True)  # so what fails below is the write itself
    before = tree(small_disk)
    with pytest.raises(StoreError, match=f"^no space left on device writing adapter cars to {re.escape(str(store.root))}$"):
        store.save("cars", model, report, snapshot, overwrite=True)
    assert tree(small_disk) == before
    result = attnft(capsys, "adapters", "import", outside.path("big"), "big", "--store", store.root)
    assert_one_line_error(result, f"no space left on device writing adapter big to {store.root}")
    assert tree(small_disk) == before
    result = attnft(
        capsys, "adapters", "export", "big", "--out", small_disk / "merged",
        "--checkpoint", tmp_path / "base.safetensors", "--store", outside.root,
    )
    assert_one_line_error(result, f"no space left on device writing export merged to {small_disk}")
    assert tree(small_disk) == before
    store.verify("cars")


def test_delete_works_on_a_full_real_disk(small_disk, trained):
    model, report, snapshot, _ = trained
    store = AdapterStore(small_disk / "store")
    store.save("cars", model, report, snapshot)
    fill(small_disk, leave=0)
    store.delete("cars")
    assert list(store.root.iterdir()) == []


def test_a_read_only_real_disk_is_one_line_for_every_write(capsys, small_disk, trained, tmp_path):
    model, report, snapshot, _ = trained
    store = AdapterStore(small_disk / "store")
    store.save("cars", model, report, snapshot)
    remount_read_only(small_disk)
    before = tree(small_disk)
    with pytest.raises(StoreError, match=f"^read-only file system writing adapter boats to {re.escape(str(store.root))}$"):
        store.check_writable("boats")
    with pytest.raises(StoreError, match="^read-only file system writing adapter cars"):
        store.save("cars", model, report, snapshot, overwrite=True)
    assert_one_line_error(attnft(capsys, "adapters", "import", store.path("cars"), "pets", "--store", store.root), "read-only file system")
    assert_one_line_error(attnft(capsys, "adapters", "delete", "cars", "--store", store.root), "read-only file system deleting adapter cars")
    assert tree(small_disk) == before
    store.verify("cars")


@pytest.mark.parametrize("action", [("list",), ("show", "cars"), ("delete", "cars"), ("import", "SRC", "cars")])
def test_a_store_that_is_a_file_is_one_line_and_exit_2(capsys, store, tmp_path, action):
    (tmp_path / "file").write_text("not a store")
    argv = [str(store.path("cars")) if a == "SRC" else a for a in action]
    assert_one_line_error(attnft(capsys, "adapters", *argv, "--store", tmp_path / "file"), f"the store {tmp_path / 'file'}", "--store")
    assert (tmp_path / "file").read_text() == "not a store"


def test_a_store_under_a_file_is_refused_before_saving(tmp_path, trained):
    model, report, snapshot, _ = trained
    (tmp_path / "file").write_text("x")
    store = AdapterStore(tmp_path / "file" / "store")
    with pytest.raises(StoreError, match="under the file"):
        store.check_writable("cars")
    with pytest.raises(StoreError, match="under the file"):
        store.save("cars", model, report, snapshot)


def test_check_writable_accepts_a_new_name_in_a_store_not_yet_created_and_writes_nothing(tmp_path):
    store = AdapterStore(tmp_path / "a" / "store")
    assert store.check_writable("cars") == tmp_path / "a" / "store" / "cars"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden"])
def test_check_writable_refuses_a_name_that_is_empty_or_escapes(tmp_path, name):
    with pytest.raises(StoreError, match="invalid adapter name"):
        AdapterStore(tmp_path / "store").check_writable(name)


def test_check_writable_refuses_an_existing_adapter_unless_overwrite(store):
    with pytest.raises(StoreError, match="an adapter named 'cars' exists in .*: pass --overwrite to replace it$"):
        store.check_writable("cars")
    assert store.check_writable("cars", overwrite=True) == store.path("cars")


def test_check_writable_refuses_a_dangling_symlink_even_with_overwrite(store, tmp_path):
    store.path("boats").symlink_to(tmp_path / "gone")
    for overwrite in (False, True):
        with pytest.raises(StoreError, match="symbolic link to a missing"):
            store.check_writable("boats", overwrite=overwrite)


def test_check_writable_refuses_what_is_not_an_adapter_even_with_overwrite(store):
    (store.root / "notes").mkdir()
    (store.root / "notes" / "todo.txt").write_text("keep me")
    (store.root / "data.bin").write_bytes(b"keep me")
    for name in ("notes", "data.bin"):
        with pytest.raises(StoreError, match="is not an adapter"):
            store.check_writable(name, overwrite=True)
    assert (store.root / "notes" / "todo.txt").read_text() == "keep me"


def test_check_writable_refuses_when_less_than_the_needed_bytes_are_free(store):
    with pytest.raises(StoreError, match="^no space left on device writing adapter boats"):
        store.check_writable("boats", needed_bytes=1 << 62)


# --- 3. symlinks and leftovers ---------------------------------------------------------------


def test_import_refuses_a_symlink_inside_the_folder_and_copies_nothing(capsys, store, tmp_path):
    download = tmp_path / "download"
    shutil.copytree(store.path("cars"), download)
    (tmp_path / "secret").write_text("not yours")
    (download / "README.md").unlink()
    (download / "README.md").symlink_to(tmp_path / "secret")
    before = tree(store.root)
    result = attnft(capsys, "adapters", "import", download, "pets", "--store", store.root)
    assert_one_line_error(result, "README.md is a symbolic link", "regular files only")
    assert tree(store.root) == before


def test_import_refuses_a_folder_that_is_a_symlink(capsys, store, tmp_path):
    (tmp_path / "link").symlink_to(store.path("cars"))
    before = tree(store.root)
    assert_one_line_error(attnft(capsys, "adapters", "import", tmp_path / "link", "pets", "--store", store.root), "is a symbolic link")
    assert tree(store.root) == before


def test_import_copies_regular_files_only(store, tmp_path):
    download = tmp_path / "download"
    shutil.copytree(store.path("cars"), download)
    (download / ".cache").mkdir()
    (download / ".cache" / "x").write_text("hub bookkeeping")
    (download / "extra").mkdir()
    store.import_folder(download, "pets")
    assert sorted(p.name for p in store.path("pets").iterdir()) == sorted(p.name for p in store.path("cars").iterdir())


def test_overwrite_onto_a_symlinked_entry_replaces_the_link_and_leaves_no_temporary(capsys, store, trained, tmp_path):
    model, report, snapshot, _ = trained
    shutil.copytree(store.path("cars"), tmp_path / "elsewhere")
    kept = tree(tmp_path / "elsewhere")
    for how in ("save", "import"):
        store.path("boats").symlink_to(tmp_path / "elsewhere")
        if how == "save":
            store.save("boats", model, report, snapshot, mode="delta", overwrite=True)
        else:
            code, _, err = attnft(capsys, "adapters", "import", store.path("cars"), "boats", "--overwrite", "--store", store.root)
            assert code == 0, err
        assert not store.path("boats").is_symlink() and store.path("boats").is_dir()
        store.verify("boats")
        assert hidden(store.root) == []
        assert tree(tmp_path / "elsewhere") == kept  # what the link pointed to is not the store's to delete
        store.delete("boats")


def test_delete_of_a_symlinked_entry_removes_only_the_link(store, tmp_path):
    shutil.copytree(store.path("cars"), tmp_path / "elsewhere")
    store.path("boats").symlink_to(tmp_path / "elsewhere")
    store.delete("boats")
    assert not os.path.lexists(store.path("boats")) and (tmp_path / "elsewhere" / WEIGHTS_FILE).is_file()
    store.path("gone").symlink_to(tmp_path / "missing")
    store.delete("gone")  # a dangling link too
    assert sorted(p.name for p in store.root.iterdir()) == ["cars"]


def _leftovers(root: Path, tmp_path: Path) -> dict[str, Path]:
    """Hidden entries as killed and live writers leave them: the stale ones old, one fresh, one live."""
    old = time.time() - 2 * STALE_AFTER_S
    entries = {
        "stale_dir": root / f".tmp-cars-{DEAD_PID}-abc123",
        "stale_link": root / f".tmp-boats-{DEAD_PID}-def456",
        "stale_del": root / f".del-pets-{DEAD_PID}-0a1b2c3d",
        "fresh": root / f".tmp-pets-{DEAD_PID}-ghi789",
        "live": root / f".tmp-cars-{os.getpid()}-jkl012",
    }
    for key, path in entries.items():
        if key == "stale_link":
            path.symlink_to(tmp_path / "gone")  # what an overwrite onto a symlink used to leave
        else:
            path.mkdir()
            (path / WEIGHTS_FILE).write_bytes(b"half")
            if key != "fresh":
                os.utime(path / WEIGHTS_FILE, (old, old))
        if key != "fresh":
            os.utime(path, (old, old), follow_symlinks=False)
    return entries


@pytest.mark.parametrize("write", ["save", "import", "delete"])
def test_every_write_clears_stale_temporaries_of_dead_writers_and_only_those(store, trained, tmp_path, write):
    model, report, snapshot, _ = trained
    entries = _leftovers(store.root, tmp_path)
    if write == "save":
        store.save("boats", model, report, snapshot)
    elif write == "import":
        store.import_folder(store.path("cars"), "boats")
    else:
        store.delete("cars")
    assert hidden(store.root) == sorted([entries["fresh"].name, entries["live"].name])


def test_remove_leftovers_removes_a_dangling_temporary_symlink(store, tmp_path):
    link = store.root / f".tmp-cars-{DEAD_PID}-abc123"
    link.symlink_to(tmp_path / "gone")
    assert store.remove_leftovers() == [link]
    assert hidden(store.root) == []


# --- 4. messages, pipes and file modes -------------------------------------------------------


def test_refusals_name_the_cli_flags_not_python_arguments(store, trained, tmp_path):
    model, report, snapshot, base_state = trained
    messages = []
    for call in (
        lambda: store.save("cars", model, report, snapshot),
        lambda: store.import_folder(store.path("cars"), "cars"),
        lambda: save_adapter(store.path("cars"), model, report, snapshot),
        lambda: export_adapter(store.path("cars"), store.root, base_model=tiny_model("vit")),
    ):
        with pytest.raises(StoreError) as error:
            call()
        messages.append(str(error.value))
    torch.manual_seed(99)
    with pytest.raises(BaseMismatchError) as error:
        load_adapter(tiny_model("vit"), store.path("cars"))
    messages.append(str(error.value))
    for message in messages:
        assert "=True" not in message and "overwrite=" not in message, message
    assert all("pass --overwrite" in m for m in messages[:4]) and "pass --ignore-fingerprint" in messages[4]


def test_show_into_a_closed_pipe_exits_quietly(store):
    # as `attnft adapters show cars | head -1` once head has gone: the reader is closed before anything is written
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [sys.executable, "-m", "attnft", "adapters", "show", "cars", "--store", str(store.root)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    child.stdout.close()
    err = child.stderr.read().decode()
    child.wait(timeout=120)
    assert err == "" and child.returncode == 1


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_weights_in_the_store_and_in_exports_are_mode_0644_like_the_other_files(store, trained, tmp_path):
    model, report, snapshot, base_state = trained
    store.save("delta", model, report, snapshot, mode="delta")
    store.import_folder(store.path("cars"), "copy")
    base = tiny_model("vit")
    base.load_state_dict(base_state)
    export = export_adapter(store.path("cars"), tmp_path / "export", base_model=base)
    for folder in (store.path("cars"), store.path("delta"), store.path("copy"), export.folder):
        assert {p.name: _mode(p) for p in folder.iterdir()} == {p.name: 0o644 for p in folder.iterdir()}
        assert _mode(folder) == 0o755


def test_peft_weights_in_the_store_are_mode_0644(tmp_path, peft_trained):
    store = AdapterStore(tmp_path / "store")
    path = save_peft(store, "cars-lora", *peft_trained)
    assert {p.name: _mode(p) for p in path.iterdir()} == {p.name: 0o644 for p in path.iterdir()}
