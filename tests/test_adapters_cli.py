"""``attnft adapters ...``: the store from the command line; bad input is one line and exit code 2."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from attnft.methods.record import AdapterRecord
from attnft.core.files import CONFIG_FILE, WEIGHTS_FILE
from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.cli import main
from attnft.methods.freeze.policy import apply_policy
from attnft.adapters.store import AdapterStore
from tiny_models import tiny_input, tiny_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained():
    """A tiny ViT base (and its weights file) and a copy fine-tuned one step under ``attn`` with 4 classes."""
    model = tiny_model("vit")
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    model.reset_classifier(4)
    report = apply_policy(model, "attn")
    snapshot = BaseSnapshot.capture(model, report)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(tiny_input(model)).pow(2).mean().backward()
    optimizer.step()
    return model.eval(), report, snapshot, base_state


@pytest.fixture
def store(tmp_path, trained):
    model, report, snapshot, base_state = trained
    store = AdapterStore(tmp_path / "store")
    store.save("cars", model, report, snapshot, AdapterRecord.of(model, label_names=["a", "b", "c", "d"]))
    store.save("flowers", model, report, snapshot, mode="delta")
    save_file(base_state, str(tmp_path / "base.safetensors"))
    return store


def attnft(capsys, *argv):
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def snapshot_tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_one_line_error(result, *words):
    """``result`` from :func:`attnft`: exit code 2, nothing on stdout, one line on stderr naming ``words``."""
    code, out, err = result
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnft: error:"), err
    for word in words:
        assert word in lines[0], lines[0]


# --- what works ---


def test_list_prints_one_row_per_adapter(capsys, store):
    code, out, _ = attnft(capsys, "adapters", "list", "--store", str(store.root))
    assert code == 0
    rows = out.strip().splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["cars", "flowers"]
    assert "delta-float16" in rows[1]


def test_store_defaults_to_the_environment_variable(capsys, store, monkeypatch):
    monkeypatch.setenv("ATTNFT_STORE", str(store.root))
    code, out, _ = attnft(capsys, "adapters", "list", "--json")
    assert code == 0 and [a["name"] for a in json.loads(out)] == ["cars", "flowers"]


def test_show_prints_the_config(capsys, store):
    code, out, _ = attnft(capsys, "adapters", "show", "cars", "--store", str(store.root), "--json")
    assert code == 0
    info = json.loads(out)
    assert info["num_classes"] == 4 and info["label_names"] == ["a", "b", "c", "d"] and info["policy"] == "attn"


def test_verify_checks_every_adapter(capsys, store):
    code, out, _ = attnft(capsys, "adapters", "verify", "--store", str(store.root))
    assert code == 0 and out.split() == ["ok", "cars", "ok", "flowers"]


def test_verify_all_reports_each_broken_adapter_and_exits_2(capsys, store):
    (store.path("flowers") / CONFIG_FILE).unlink()
    code, out, _ = attnft(capsys, "adapters", "verify", "--store", str(store.root))
    assert code == 2 and "ok cars" in out and "FAILED flowers" in out


def test_delete_removes_the_adapter(capsys, store):
    code, _, _ = attnft(capsys, "adapters", "delete", "cars", "--store", str(store.root))
    assert code == 0 and store.names() == ["flowers"]


def test_import_copies_an_adapter_folder(capsys, store, tmp_path):
    code, _, _ = attnft(capsys, "adapters", "import", str(store.path("cars")), "cars2", "--store", str(store.root))
    assert code == 0 and store.verify("cars2").num_classes == 4


def test_export_writes_a_checkpoint_that_reproduces_the_finetuned_model(capsys, store, trained, tmp_path):
    import timm

    code, out, _ = attnft(
        capsys, "adapters", "export", "cars", "--store", str(store.root),
        "--out", str(tmp_path / "export"), "--checkpoint", str(tmp_path / "base.safetensors"),
    )
    assert code == 0 and "timm.create_model(" in out
    exported = timm.create_model(f"local-dir:{tmp_path / 'export'}", pretrained=True).eval()
    x = tiny_input(trained[0])
    with torch.no_grad():
        assert torch.equal(exported(x), trained[0](x))


# --- bad input: one line, exit code 2, nothing written ---


def test_truncated_file_is_one_line_and_exit_2(capsys, store):
    weights = store.path("cars") / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-64])
    assert_one_line_error(attnft(capsys, "adapters", "verify", "cars", "--store", str(store.root)), "truncated")


def test_corrupted_header_is_one_line_and_exit_2(capsys, store):
    weights = store.path("cars") / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[8:16] = b"not json"
    weights.write_bytes(bytes(data))
    assert_one_line_error(attnft(capsys, "adapters", "verify", "cars", "--store", str(store.root)), "corrupted header")


def test_missing_config_is_one_line_and_exit_2(capsys, store):
    (store.path("cars") / CONFIG_FILE).unlink()
    assert_one_line_error(attnft(capsys, "adapters", "show", "cars", "--store", str(store.root)), CONFIG_FILE)


def test_stated_num_classes_or_policy_mismatch_is_one_line_and_exit_2(capsys, store):
    root = str(store.root)
    assert_one_line_error(attnft(capsys, "adapters", "verify", "cars", "--num-classes", "10", "--store", root), "classes")
    assert_one_line_error(attnft(capsys, "adapters", "verify", "cars", "--policy", "ffn", "--store", root), "policy")


@pytest.mark.parametrize("action", [("show",), ("delete",), ("verify",), ("export", "--out", "OUT")])
def test_a_name_that_escapes_the_store_is_one_line_and_exit_2(capsys, store, tmp_path, action):
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / CONFIG_FILE).write_text("{}")
    before = snapshot_tree(tmp_path)
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in action]
    result = attnft(capsys, "adapters", argv[0], "../victim", *argv[1:], "--store", str(store.root))
    assert_one_line_error(result, "invalid adapter name")
    assert snapshot_tree(tmp_path) == before


def test_import_under_a_name_that_escapes_writes_nothing(capsys, store, tmp_path):
    before = snapshot_tree(tmp_path)
    result = attnft(capsys, "adapters", "import", str(store.path("cars")), "../evil", "--store", str(store.root))
    assert_one_line_error(result, "invalid adapter name")
    assert snapshot_tree(tmp_path) == before


def test_overwrite_without_the_flag_is_one_line_and_exit_2(capsys, store, tmp_path):
    before = snapshot_tree(store.root)
    result = attnft(capsys, "adapters", "import", str(store.path("flowers")), "cars", "--store", str(store.root))
    assert_one_line_error(result, "--overwrite")
    assert snapshot_tree(store.root) == before
    (tmp_path / "out").mkdir()
    result = attnft(capsys, "adapters", "export", "cars", "--out", str(tmp_path / "out"), "--store", str(store.root))
    assert_one_line_error(result, "--overwrite")
    assert list((tmp_path / "out").iterdir()) == []


def test_overwrite_with_the_flag_replaces(capsys, store):
    code, _, _ = attnft(capsys, "adapters", "import", str(store.path("flowers")), "cars", "--overwrite", "--store", str(store.root))
    assert code == 0 and store.config("cars").mode == "delta"


def test_export_onto_another_base_is_one_line_exit_2_and_writes_nothing(capsys, store, tmp_path):
    torch.manual_seed(99)
    save_file(tiny_model("vit").state_dict(), str(tmp_path / "other.safetensors"))  # same architecture, other weights
    fingerprint = store.config("cars").base_fingerprint
    result = attnft(
        capsys, "adapters", "export", "cars", "--store", str(store.root),
        "--out", str(tmp_path / "export"), "--checkpoint", str(tmp_path / "other.safetensors"),
    )
    assert_one_line_error(result, "vit_small_patch16_224", fingerprint[:12])
    assert not (tmp_path / "export").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_installed_entry_point_gives_the_same_one_line_error():
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-m", "attnft", "adapters", "show", "../x"], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "invalid adapter name" in out.stderr
