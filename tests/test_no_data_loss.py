"""Nothing outside attnft's own files is ever replaced (issue: robustness, round two, "data lost").

``--overwrite`` replaces only what attnft wrote (an export, recognised by its files; an adapter in
the store), never a store, an adapter under export, or a folder holding anything else; an output
path is a regular file or absent, never a FIFO, device or symlink. Each case checks the victim
files intact afterwards.
"""
import os
import shutil
import socket
import stat
from pathlib import Path

import pytest

from attnft.methods.freeze.save import save_adapter
from attnft.cli import main
from attnft.core.errors import StoreError
from attnft.core.files import ADAPTER_FOLDER, EXPORT_FOLDER, write_text_atomically
from attnft.adapters.store import AdapterStore
from test_adapters_cli import assert_one_line_error, attnft, snapshot_tree, store, trained  # noqa: F401  (fixtures)


def export(capsys, store, out, *extra):
    return attnft(capsys, "adapters", "export", "cars", "--store", str(store.root), "--out", str(out),
                  "--checkpoint", str(store.root.parent / "base.safetensors"), *extra)


def test_export_onto_the_store_with_overwrite_is_refused_and_every_adapter_stays(capsys, store):
    before = snapshot_tree(store.root)
    assert_one_line_error(export(capsys, store, store.root, "--overwrite"), "store")
    assert snapshot_tree(store.root) == before and store.names() == ["cars", "flowers"]


def test_export_onto_the_adapter_being_exported_is_refused(capsys, store):
    before = snapshot_tree(store.root)
    assert_one_line_error(export(capsys, store, store.path("cars"), "--overwrite"), "store")
    assert snapshot_tree(store.root) == before
    store.verify("cars")


def test_export_over_a_folder_holding_other_files_is_refused_and_they_stay(capsys, store, trained, tmp_path):  # noqa: F811
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert_one_line_error(export(capsys, store, mine, "--overwrite"), "not an export attnft wrote")
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"] and (mine / "thesis.tex").read_text() == "years of work"
    # another store (not the one --store names): refused by what it holds
    other = AdapterStore(tmp_path / "other-store")
    model, report, snapshot, _ = trained
    other.save("dogs", model, report, snapshot)
    before = snapshot_tree(other.root)
    assert_one_line_error(export(capsys, store, other.root, "--overwrite"), "not an export attnft wrote")
    assert snapshot_tree(other.root) == before


def test_export_replaces_its_own_earlier_export(capsys, store, tmp_path):
    out = tmp_path / "export"
    assert export(capsys, store, out)[0] == 0
    names = sorted(p.name for p in out.iterdir())
    assert EXPORT_FOLDER.holds(out) and not ADAPTER_FOLDER.holds(out)
    (out / "model.safetensors").write_bytes(b"stale")
    assert export(capsys, store, out, "--overwrite")[0] == 0
    assert sorted(p.name for p in out.iterdir()) == names and (out / "model.safetensors").read_bytes() != b"stale"


def test_an_adapter_never_replaces_a_folder_that_is_no_adapter(store, trained, tmp_path):
    model, report, snapshot, _ = trained
    (store.root / "notes").mkdir()
    (store.root / "notes" / "todo.txt").write_text("keep")
    with pytest.raises(StoreError, match="not an adapter"):
        store.save("notes", model, report, snapshot, overwrite=True)
    with pytest.raises(StoreError, match="not an adapter attnft wrote"):  # the library call, outside any store
        save_adapter(store.root / "notes", model, report, snapshot, overwrite=True)
    assert [p.name for p in (store.root / "notes").iterdir()] == ["todo.txt"]
    assert (store.root / "notes" / "todo.txt").read_text() == "keep"
    store.save("cars", model, report, snapshot, overwrite=True, mode="delta")  # an adapter: replaced
    assert store.config("cars").mode == "delta"


def _specials(folder: Path) -> dict:
    """A FIFO, a Unix socket and a symlink (to a regular file) in ``folder``: name -> path."""
    fifo, sock, link = folder / "fifo", folder / "sock", folder / "link"
    os.mkfifo(fifo)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    (folder / "target.json").write_text("keep")
    link.symlink_to(folder / "target.json")
    return {"fifo": fifo, "sock": sock, "link": link, "_server": server}


@pytest.mark.parametrize("kind", ["fifo", "sock", "link"])
def test_eval_output_that_is_no_regular_file_is_refused_before_evaluating(capsys, store, tmp_path, kind):
    specials = _specials(tmp_path)
    try:
        path = specials[kind]
        mode = os.lstat(path).st_mode
        result = attnft(capsys, "eval", "--adapter", "cars", "--store", str(store.root), "--output", str(path), "--overwrite")
        assert_one_line_error(result, str(path), "not a regular file")
        assert os.lstat(path).st_mode == mode and (tmp_path / "target.json").read_text() == "keep"
    finally:
        specials["_server"].close()


def test_every_file_write_refuses_a_device_or_fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(StoreError, match="is a FIFO, not a regular file"):
        write_text_atomically(tmp_path / "fifo", "x", "the thing")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    with pytest.raises(StoreError, match="is a device, not a regular file"):
        write_text_atomically(Path("/dev/null"), "x", "the thing")  # as root the old code replaced it
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_a_run_whose_output_dir_holds_a_fifo_for_its_log_is_refused_before_anything(capsys, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "metrics.jsonl")
    code = main(["finetune", "--model", "vit_fmnist_patch4_28", "--max-train", "64", "--max-eval", "64",
                 "--steps", "1", "--batch-size", "32", "--workers", "0", "--no-progress",
                 "--output-dir", str(out), "--store", str(tmp_path / "store"), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and "not a regular file" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"] and stat.S_ISFIFO(os.lstat(out / "metrics.jsonl").st_mode)
    assert not (tmp_path / "store").exists()


def _tiny_run(out, store, *extra):
    return ["finetune", "--model", "vit_fmnist_patch4_28", "--max-train", "64", "--max-eval", "64", "--steps", "1",
            "--batch-size", "32", "--workers", "0", "--no-progress", "--output-dir", str(out), "--store", str(store),
            *extra]


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
@pytest.mark.parametrize("foreign", ["a user's file", "a FIFO named as a checkpoint"])
def test_a_checkpoints_folder_holding_what_attnft_did_not_write_is_refused_and_kept(capsys, tmp_path, flag, foreign):
    """A fresh run removes the earlier checkpoints and a resumed one reads the newest: a user's file there is
    never deleted, and a FIFO named as a checkpoint never hangs the read."""
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    if foreign == "a user's file":
        (folder / "notes.txt").write_text("mine")
    else:
        os.mkfifo(folder / "step_00000001.pt")
    assert main(_tiny_run(tmp_path / "run", tmp_path / "store", flag)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "which is no checkpoint attnft wrote" in lines[0], lines
    if foreign == "a user's file":
        assert (folder / "notes.txt").read_text() == "mine"
    else:
        assert stat.S_ISFIFO(os.lstat(folder / "step_00000001.pt").st_mode)
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["checkpoints"] and not (tmp_path / "store").exists()


def test_a_fresh_run_over_an_earlier_one_removes_its_checkpoints_only(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(_tiny_run(out, tmp_path / "store", "--checkpoint-every", "1")) == 0
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000001.pt"]
    (out / "checkpoints" / ".step_00000002.pt.tmp").write_bytes(b"a crashed write")
    assert main(_tiny_run(out, tmp_path / "store", "--overwrite")) == 0
    assert not (out / "checkpoints").exists()  # an earlier run's checkpoints, and its crashed write, are gone


def test_a_checkpoints_folder_linked_elsewhere_is_used_and_kept(capsys, tmp_path):
    """A link to a roomier disk: checkpoints are written through it, and --overwrite empties it, keeping the link."""
    out, scratch = tmp_path / "run", tmp_path / "scratch"
    out.mkdir()
    scratch.mkdir()
    (out / "checkpoints").symlink_to(scratch)
    assert main(_tiny_run(out, tmp_path / "store", "--checkpoint-every", "1")) == 0
    assert [p.name for p in scratch.iterdir()] == ["step_00000001.pt"]
    assert main(_tiny_run(out, tmp_path / "store", "--overwrite")) == 0
    assert (out / "checkpoints").is_symlink() and scratch.is_dir() and not any(scratch.iterdir())


# --- round three: nothing attnft did not write is deleted or replaced (each victim hashed before and after) ---


def _hashes(root: Path) -> dict:
    """sha256 of every file under ``root`` (and the folders there), by relative path."""
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _a_second_store(root: Path, trained) -> None:
    model, report, snapshot, _ = trained
    inner = AdapterStore(root)
    inner.save("dogs", model, report, snapshot)
    inner.save("cats", model, report, snapshot, mode="delta")


@pytest.mark.parametrize("victim", ["documents", "a second store", "a readme alone", "a plain peft adapter",
                                    "an adapter plus a user's file", "an adapter's files without its marker"])
def test_delete_refuses_every_folder_that_is_no_adapter_attnft_wrote_and_removes_nothing(capsys, store, trained, victim):
    folder = store.root / "victim"
    if victim == "documents":
        (folder / "sub").mkdir(parents=True)
        (folder / "t.txt").write_text("thesis")
        (folder / "sub" / "notes.txt").write_text("more")
    elif victim == "a second store":
        _a_second_store(folder, trained)
    elif victim == "a readme alone":
        folder.mkdir()
        (folder / "README.md").write_text("# my notes")
    elif victim == "a plain peft adapter":  # peft's own files, as a hub download holds them: no attnft sidecar
        folder.mkdir()
        (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
        (folder / "adapter_model.safetensors").write_bytes(b"weights")
        (folder / "README.md").write_text("a peft adapter")
    elif victim == "an adapter plus a user's file":
        shutil.copytree(store.path("cars"), folder)
        (folder / "train.py").write_text("print('mine')")
    else:
        shutil.copytree(store.path("cars"), folder)
        config = folder / "adapter_config.json"
        config.write_text(config.read_text().replace('"attnft-adapter"', '"someone-else"'))
    before = _hashes(store.root)
    result = attnft(capsys, "adapters", "delete", "victim", "--store", str(store.root))
    assert_one_line_error(result, "victim", "not an adapter attnft wrote", "nothing was deleted")
    assert _hashes(store.root) == before


def test_delete_removes_an_adapter_of_either_format_and_only_its_files(capsys, store, tmp_path):
    from attnft.core.files import ADAPTER_FOLDER

    assert ADAPTER_FOLDER.holds(store.path("cars"), empty_ok=False)
    assert attnft(capsys, "adapters", "delete", "cars", "--store", str(store.root))[0] == 0
    assert store.names() == ["flowers"] and not [p for p in store.root.iterdir() if p.name.startswith(".")]


def _user_folder(path: Path, files: dict) -> dict:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return _hashes(path)


@pytest.mark.parametrize("flag", [None, "--overwrite", "--resume"])
def test_a_run_never_replaces_a_users_config_yaml(capsys, tmp_path, flag):
    out = tmp_path / "p"
    before = _user_folder(out, {"config.yaml": "lr: 0.1  # my own experiment\n"})
    assert main(_tiny_run(out, tmp_path / "store", *([flag] if flag else []))) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "config.yaml, which no attnft run wrote" in lines[0], lines
    assert _hashes(out) == before and not (tmp_path / "store").exists()


def test_overwrite_never_replaces_a_users_metrics_and_result(capsys, tmp_path):
    out = tmp_path / "p"
    before = _user_folder(out, {"metrics.jsonl": '{"step": 1}\n', "result.json": "{}", "train.py": "print(1)"})
    assert main(_tiny_run(out, tmp_path / "store", "--overwrite")) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "metrics.jsonl, result.json, which no attnft run wrote" in lines[0], lines
    assert _hashes(out) == before


def test_overwrite_replaces_a_run_attnft_wrote_and_keeps_the_users_other_files(capsys, tmp_path):
    out = tmp_path / "p"
    assert main(_tiny_run(out, tmp_path / "store")) == 0
    (out / "train.py").write_text("print('mine')")
    assert main(_tiny_run(out, tmp_path / "store", "--name", "second")) == 2  # another run: --overwrite takes it on
    assert "holds another run" in capsys.readouterr().err
    assert main(_tiny_run(out, tmp_path / "store", "--overwrite", "--name", "second")) == 0
    assert (out / "train.py").read_text() == "print('mine')"


@pytest.mark.parametrize("flag", [None, "--overwrite"])
def test_a_run_never_writes_into_an_adapter_folder_or_the_store(capsys, store, flag):
    extra = [flag] if flag else []
    for out in (store.path("cars"), store.path("cars") / "run", store.root, store.root / "run"):
        before = _hashes(store.root)
        assert main(_tiny_run(out, store.root, "--name", "t3", *extra)) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "--output-dir" in lines[0] and ("adapter attnft wrote" in lines[0] or "the adapter store" in lines[0]), lines
        assert _hashes(store.root) == before


@pytest.mark.parametrize("where", ["the adapter's config", "a new file in the adapter", "the store"])
def test_eval_output_never_lands_in_an_adapter_folder_or_the_store(capsys, store, where):
    output = {"the adapter's config": store.path("cars") / "adapter_config.json",
              "a new file in the adapter": store.path("cars") / "eval.json",
              "the store": store.root / "eval.json"}[where]
    before = _hashes(store.root)
    result = attnft(capsys, "eval", "--adapter", "cars", "--store", str(store.root), "--output", str(output), "--overwrite")
    assert_one_line_error(result, "--output", str(output))
    assert _hashes(store.root) == before
    store.verify("cars")


def test_export_overwrite_never_replaces_a_hub_download_of_the_same_file_names(capsys, store, tmp_path):
    model_folder = tmp_path / "m"  # what a timm hub download holds
    before = _user_folder(model_folder, {"config.json": '{"architecture": "vit_small_patch16_224"}',
                                         "model.safetensors": "weights", "README.md": "# a model"})
    assert_one_line_error(export(capsys, store, model_folder, "--overwrite"), "not an export attnft wrote")
    assert _hashes(model_folder) == before


def test_export_never_writes_inside_an_adapter_or_an_export(capsys, store, tmp_path):
    assert export(capsys, store, tmp_path / "export")[0] == 0
    adapter_elsewhere = tmp_path / "elsewhere"
    shutil.copytree(store.path("cars"), adapter_elsewhere)  # an adapter outside any store
    for out, words in ((store.path("cars") / "export", "the adapter store"), (adapter_elsewhere / "export", "an adapter attnft wrote"),
                       (tmp_path / "export" / "nested", "an export attnft wrote")):
        before = _hashes(tmp_path)
        assert_one_line_error(export(capsys, store, out), words)
        assert _hashes(tmp_path) == before
