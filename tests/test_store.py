"""The store: named adapters that stay whole whatever happens to the process writing them."""
import fnmatch
import json
import multiprocessing
import random
import shutil
import time
from pathlib import Path

import pytest
import torch

from attnft.methods.record import AdapterRecord
from attnft.core.files import CONFIG_FILE, WEIGHTS_FILE
from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.core.errors import AdapterError, OfflineError, StoreError
from attnft.core.files import FolderKind, Marker, write_directory_atomically
from attnft.methods.freeze.policy import apply_policy
from attnft.adapters.store import AdapterStore, check_name
from tiny_models import tiny_input, tiny_model


def trained(num_classes=3, **model_kwargs):
    """A tiny ViT fine-tuned one step under ``attn``: (model, report, snapshot, base_state)."""
    model = tiny_model("vit", **model_kwargs)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    model.reset_classifier(num_classes)
    report = apply_policy(model, "attn")
    snapshot = BaseSnapshot.capture(model, report)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(tiny_input(model)).pow(2).mean().backward()
    optimizer.step()
    return model.eval(), report, snapshot, base_state


@pytest.fixture(scope="module")
def vit():
    return trained()


@pytest.fixture
def store(tmp_path, vit):
    store = AdapterStore(tmp_path / "store")
    model, report, snapshot, _ = vit
    store.save("cars", model, report, snapshot)
    store.save("flowers.v2", model, report, snapshot, mode="delta")
    return store


# --- names ---


@pytest.mark.parametrize("name", ["cars", "Flowers-102", "inat_2019.v2", "0"])
def test_valid_names_are_accepted(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["../x", "..", "a/b", "/abs", "a\\b", ".hidden", "a..b", "", "-x", "x" * 200, "café"])
def test_names_that_could_escape_or_hide_are_refused(tmp_path, vit, name):
    store = AdapterStore(tmp_path / "store")
    model, report, snapshot, _ = vit
    with pytest.raises(StoreError, match="invalid adapter name"):
        store.save(name, model, report, snapshot)
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["store"])


# --- operations ---


def test_list_describes_every_adapter_from_its_config(store):
    summaries = {s.name: s for s in store.list()}
    assert set(summaries) == {"cars", "flowers.v2"}
    assert summaries["cars"].mode == "exact" and summaries["flowers.v2"].mode == "delta-float16"
    assert summaries["cars"].num_classes == 3 and summaries["cars"].policy == "attn"
    assert summaries["cars"].size_bytes > summaries["flowers.v2"].size_bytes > 0
    assert not any(s.error for s in summaries.values())


def test_show_gives_the_config_and_file_sizes(store):
    info = store.show("cars")
    assert info["name"] == "cars" and info["model_name"].startswith("vit_small_patch16_224")
    assert set(info["files"]) == {CONFIG_FILE, WEIGHTS_FILE, "README.md"}


def test_verify_passes_a_good_adapter_and_fails_a_damaged_one(store):
    store.verify("cars")
    weights = store.path("cars") / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(AdapterError):
        store.verify("cars")


def test_load_by_name_reproduces_the_finetuned_model(store, vit):
    model, _, _, base_state = vit
    base = tiny_model("vit")
    base.load_state_dict(base_state)
    store.load("cars", base.eval())
    x = tiny_input(base)
    with torch.no_grad():
        assert (base(x) - model(x)).abs().max() <= 1e-6


def test_delete_removes_the_adapter_and_only_it(store):
    store.delete("cars")
    assert [s.name for s in store.list()] == ["flowers.v2"]
    assert sorted(p.name for p in store.root.iterdir()) == ["flowers.v2"]


def test_save_passes_the_delta_dtype_and_license_to_the_format(tmp_path, vit):
    model, report, snapshot, _ = vit
    store = AdapterStore(tmp_path / "store")
    store.save("bf16", model, report, snapshot, AdapterRecord.of(model, license="mit"), mode="delta", delta_dtype="bfloat16")
    assert store.config("bf16").delta_dtype == "bfloat16"
    assert "license: mit" in (store.path("bf16") / "README.md").read_text()


def test_missing_adapter_is_a_store_error(store):
    with pytest.raises(StoreError, match="no adapter named 'boats'"):
        store.read("boats")
    with pytest.raises(StoreError):
        store.delete("boats")


def test_save_refuses_an_existing_name_without_overwrite(store, vit):
    model, report, snapshot, _ = vit
    before = (store.path("cars") / WEIGHTS_FILE).read_bytes()
    with pytest.raises(StoreError, match="overwrite"):
        store.save("cars", model, report, snapshot, mode="delta")
    assert (store.path("cars") / WEIGHTS_FILE).read_bytes() == before


def test_import_copies_a_verified_folder_and_refuses_a_broken_one(store, tmp_path):
    path = store.import_folder(store.path("cars"), "cars-copy")
    store.verify("cars-copy")
    assert (path / WEIGHTS_FILE).read_bytes() == (store.path("cars") / WEIGHTS_FILE).read_bytes()
    (store.path("flowers.v2") / CONFIG_FILE).unlink()
    with pytest.raises(AdapterError):
        store.import_folder(store.path("flowers.v2"), "broken")
    assert not store.path("broken").exists()


def test_a_failed_write_leaves_nothing_and_keeps_the_old_folder(tmp_path):
    target = tmp_path / "a"
    kind = FolderKind("a test folder", required=("f",), files=("f",), markers=(Marker("f", "test"),))
    write_directory_atomically(target, lambda folder: (folder / "f").write_text('{"format": "test", "v": "old"}'), kind=kind)

    def failing(folder):
        (folder / "f").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_directory_atomically(target, failing, kind=kind, overwrite=True)
    assert json.loads((target / "f").read_text())["v"] == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a"]


def test_leftovers_of_dead_writers_are_removed_and_never_listed(store):
    leftover = store.root / ".tmp-cars-999999999-abc123"
    leftover.mkdir()
    (leftover / CONFIG_FILE).write_text("{")
    assert [s.name for s in store.list()] == ["cars", "flowers.v2"]
    assert store.remove_leftovers() == [leftover]
    assert not leftover.exists()


# --- a hub ---


class LocalHub:
    """A stand-in for huggingface_hub.HfApi (no network here): each repo is a folder under ``root``."""

    def __init__(self, root: Path):
        self.root = root

    def create_repo(self, repo_id, private=None, exist_ok=False):
        (self.root / repo_id).mkdir(parents=True, exist_ok=exist_ok)

    def upload_folder(self, repo_id, folder_path, commit_message=None):
        shutil.copytree(folder_path, self.root / repo_id, dirs_exist_ok=True)

    def snapshot_download(self, repo_id, revision=None, local_dir=None, allow_patterns=None):
        for file in (self.root / repo_id).iterdir():
            if any(fnmatch.fnmatch(file.name, pattern) for pattern in allow_patterns):
                shutil.copyfile(file, Path(local_dir) / file.name)
        return str(local_dir)


def test_push_uploads_the_folder_as_a_hub_repo_and_pull_brings_it_back_verified(store, tmp_path):
    from huggingface_hub import ModelCard

    hub = LocalHub(tmp_path / "hub")
    store.push("cars", "me/cars-attn", hub=hub)
    assert ModelCard.load(tmp_path / "hub" / "me/cars-attn" / "README.md").data.library_name == "attnft"
    other = AdapterStore(tmp_path / "other")
    other.pull("me/cars-attn", "cars", hub=hub)
    assert (other.path("cars") / WEIGHTS_FILE).read_bytes() == (store.path("cars") / WEIGHTS_FILE).read_bytes()


def test_pull_of_a_damaged_repo_stores_nothing(store, tmp_path):
    hub = LocalHub(tmp_path / "hub")
    store.push("cars", "me/cars-attn", hub=hub)
    weights = tmp_path / "hub" / "me/cars-attn" / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(AdapterError, match="truncated"):
        store.pull("me/cars-attn", "pulled", hub=hub)
    assert "pulled" not in store.names() and not store.path("pulled").exists()


def test_pull_offline_with_the_real_hub_client_is_an_offline_error(store):
    with pytest.raises(OfflineError, match="offline"):
        store.pull("someone/some-adapter", "pulled")
    assert not store.path("pulled").exists()


def test_hub_errors_make_an_invalid_repo_id_the_caller_s_error_and_an_offline_hub_an_offline_error():
    from huggingface_hub.errors import OfflineModeIsEnabled
    from huggingface_hub.utils import validate_repo_id

    from attnft.core.errors import UnknownModelError
    from attnft.core.hub import hub_errors

    with pytest.raises(UnknownModelError, match="^model a//b: not found on the hub"):
        with hub_errors("model a//b", missing=UnknownModelError):
            validate_repo_id("a//b")
    with pytest.raises(OfflineError, match="offline .*; pass --checkpoint FILE$"):
        with hub_errors("model x", hint="; pass --checkpoint FILE"):
            raise OfflineModeIsEnabled("HF_HUB_OFFLINE is set")


# --- SIGKILL while saving ---


def _save_forever(root: str, trained_model, writing, saves) -> None:
    """Child process: save, overwrite and delete adapters until killed."""
    model, report, snapshot = trained_model
    store = AdapterStore(root)
    rng = random.Random()
    while True:
        name = rng.choice(["a", "b", "c"])
        writing.value = 1
        if rng.random() < 0.15 and store.exists(name):
            store.delete(name)
        else:
            store.save(name, model, report, snapshot, mode=rng.choice(["exact", "delta"]), overwrite=True)
        writing.value = 0
        saves.value += 1


def test_sigkill_at_random_moments_never_leaves_an_adapter_that_fails_verify(tmp_path):
    # a fork server imports torch once; each child forks from it in milliseconds and is SIGKILLed
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "timm", "safetensors.torch", "huggingface_hub", "attnft.adapters.store", "test_store"])
    store = AdapterStore(tmp_path / "store")
    trained_model = trained(embed_dim=64, depth=4)[:3]  # sent to each child (pickled), so it starts saving at once
    rng = random.Random(0)
    kills, mid_write, deadline = 0, 0, time.monotonic() + 30
    while kills < 40 and time.monotonic() < deadline:
        writing, saves = context.Value("i", 0, lock=False), context.Value("i", 0, lock=False)
        child = context.Process(target=_save_forever, args=(str(store.root), trained_model, writing, saves), daemon=True)
        child.start()
        started = time.monotonic()
        while saves.value == 0 and writing.value == 0 and time.monotonic() - started < 20:
            time.sleep(0.005)  # until the child has built its model and begun writing
        time.sleep(rng.uniform(0.0, 0.25))
        mid_write += writing.value
        child.kill()
        child.join()
        assert child.exitcode == -9
        kills += 1
        for summary in store.list():
            assert summary.error is None, summary.error
            store.verify(summary.name)
    print(f"\n{kills} SIGKILLs, {mid_write} of them during a save or delete; {len(store.list())} adapters listed")
    assert kills >= 15 and mid_write >= kills // 2
    store.remove_leftovers()
    assert all(not p.name.startswith(".") for p in store.root.iterdir())
