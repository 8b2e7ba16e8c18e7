"""Each thing looked up once (issue 39, section 6): a classify request to the server in this process, over real HTTP
on a real socket, with the real functions wrapped by counting spies that call through.

A request looks its task's folder up once (a few stats), and the entry it gets carries what was read of that
version (its family and config) to the model's thread, which loads the weights against it: nothing is found,
read or hashed twice, and an adapter rewritten while it is read is still noticed (the newest version answers).
"""
import builtins
import io
import os
from collections import Counter
from pathlib import Path

import pytest

from attnft.adapters.store import AdapterStore
from attnft.core.files import CONFIG_FILE, SIDECAR_FILE, WEIGHTS_FILE
from attnft.methods import method_of
from attnft.methods.freeze import method as freeze_method
from attnft.methods.peft import files as peft_files
from attnft.server import catalog as catalog_module
from attnft.server.pager import AdapterPager
from serve_helpers import InProcessServer, png, save_attn_adapter, save_lora_adapter


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = AdapterStore(tmp_path_factory.mktemp("lookups") / "adapters")
    save_attn_adapter(store, "shirts", 5, 0)
    return store


@pytest.fixture(scope="module")
def server(store):
    with InProcessServer(store) as server:
        yield server


def _spy(monkeypatch, owner, name) -> list:
    """Wrap ``owner.name`` in a spy that records each call's arguments and calls the real function."""
    calls, real = [], getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


class FileSpy:
    """Every stat and every open of a file under ``root``, by the file's name: the real os.stat, open and os.open
    wrapped (pathlib's calls go through them)."""

    def __init__(self, monkeypatch, root: Path):
        self.root = str(root)
        self.stats, self.reads = Counter(), Counter()
        real_stat, real_open, real_os_open = os.stat, builtins.open, os.open

        def stat(path, *args, **kwargs):
            self._count(self.stats, path)
            return real_stat(path, *args, **kwargs)

        def open_(file, *args, **kwargs):
            self._count(self.reads, file)
            return real_open(file, *args, **kwargs)

        def os_open(path, *args, **kwargs):
            self._count(self.reads, path)
            return real_os_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "stat", stat)
        monkeypatch.setattr(builtins, "open", open_)
        monkeypatch.setattr(io, "open", open_)
        monkeypatch.setattr(os, "open", os_open)

    def _count(self, counter: Counter, path) -> None:
        if isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(self.root):
            counter[Path(path).name] += 1

    def clear(self) -> None:
        self.stats.clear()
        self.reads.clear()


def test_a_request_for_a_loaded_unchanged_task_looks_at_its_folder_once_and_reads_nothing(server, store, monkeypatch):
    assert server.classify("shirts", png(1)).status_code == 200  # loaded
    files = FileSpy(monkeypatch, store.root)
    catalog_module._signature(store.path("shirts"))
    one_look = Counter(files.stats)  # the stats of one look at the folder
    files.clear()
    looks = _spy(monkeypatch, catalog_module, "_signature")
    failures = _spy(monkeypatch, AdapterPager, "failure")
    response = server.classify("shirts", png(2))
    assert response.status_code == 200, response.text
    assert len(looks) == 1 and files.stats == one_look
    assert not files.reads  # no config, no sidecar, no weights
    assert len(failures) == 1  # asked once, by the request; the loaded task is not asked again


def test_a_task_written_while_serving_has_its_family_found_and_its_config_read_once(server, store, monkeypatch):
    save_attn_adapter(store, "fresh", 6, 1)
    files = FileSpy(monkeypatch, store.root)
    method_of(store.path("fresh")).open(store.path("fresh"))
    opened = Counter(files.reads)  # finding its family and reading its config, once
    files.clear()
    looks = _spy(monkeypatch, catalog_module, "_signature")
    response = server.classify("fresh", png(3), top_k=6)
    assert response.status_code == 200, response.text
    assert files.reads == opened + Counter({WEIGHTS_FILE: 1})  # then its weights, once, and nothing again
    assert len(looks) == 2  # the request's look, and one after the load (a folder replaced meanwhile is reloaded)


def test_a_first_peft_task_reads_its_sidecar_once_and_hashes_its_weights_once(server, store, monkeypatch):
    save_lora_adapter(store, "lora-first", 2)  # the store's first peft adapter: its backbone is created on first use
    files = FileSpy(monkeypatch, store.root)
    method_of(store.path("lora-first")).open(store.path("lora-first"))
    opened = Counter(files.reads)  # finding its family and reading its sidecar, once
    files.clear()
    hashed = _spy(monkeypatch, peft_files, "sha256_file")
    response = server.classify("lora-first", png(4))
    assert response.status_code == 200, response.text
    assert response.json()["adapter"]["format"] == "peft-lora"
    assert opened[SIDECAR_FILE] == files.reads[SIDECAR_FILE] == 1  # by the catalog; the loaders take what it read
    # then peft's config, parsed once by the checks and handed to peft, and the weights, hashed once (peft reads
    # their tensors itself)
    assert files.reads == opened + Counter({CONFIG_FILE: 1, WEIGHTS_FILE: 1}) and len(hashed) == 1


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_adapter_rewritten_while_it_is_loaded_answers_with_its_newest_version(server, store, monkeypatch, when):
    """The entry a request carries is of the version it looked up: rewritten before its weights are read (they no
    longer match the config it holds) or after (the look after the load sees it), the newest version is loaded."""
    name = f"torn-{when}"
    save_attn_adapter(store, name, 3, 10)
    old = store.config(name).weights_sha256
    real_read, reads = freeze_method.read_adapter, []

    def rewriting(path, config=None):
        reads.append(path)
        if len(reads) == 1 and when == "before":
            save_attn_adapter(store, name, 3, 11, overwrite=True)
        adapter = real_read(path, config=config)
        if len(reads) == 1 and when == "after":
            save_attn_adapter(store, name, 3, 11, overwrite=True)
        return adapter

    monkeypatch.setattr(freeze_method, "read_adapter", rewriting)
    response = server.classify(name, png(5), top_k=3)
    assert response.status_code == 200, response.text
    new = store.config(name).weights_sha256
    assert new != old and response.json()["adapter"]["weights_sha256"] == new
    assert len(reads) == 2  # the version it looked up, then the newest
