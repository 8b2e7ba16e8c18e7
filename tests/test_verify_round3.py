"""Adapters that passed ``adapters verify`` and could not serve: each is refused by the field that is off."""
import json

import pytest

from attnft.adapters.store import AdapterStore
from serve_helpers import save_attn_adapter, save_lora_adapter
from test_adapters_cli import assert_one_line_error, attnft


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    store = AdapterStore(tmp_path_factory.mktemp("verify") / "store")
    save_attn_adapter(store, "a", 3, 0)
    save_lora_adapter(store, "l", 1)
    return store


def _tampered(store: AdapterStore, tmp_path, name: str, edit) -> AdapterStore:
    import shutil

    copy = AdapterStore(tmp_path / "store")
    shutil.copytree(store.path(name), copy.path(name))
    config = copy.path(name) / "adapter_config.json"
    data = json.loads(config.read_text())
    edit(data)
    config.write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize("case, edit, words", [
    ("a tall input size", lambda d: d["data_config"].__setitem__("input_size", [3, 4096, 28]), "data_config.input_size"),
    ("a tiny std", lambda d: d["data_config"].__setitem__("std", [1e-300] * 3), "data_config.std"),
    ("a huge mean", lambda d: d["data_config"].__setitem__("mean", [1e308] * 3), "data_config.mean"),
])
def test_verify_refuses_a_data_config_no_image_can_pass_through(capsys, saved, tmp_path, case, edit, words):
    store = _tampered(saved, tmp_path, "a", edit)
    assert_one_line_error(attnft(capsys, "adapters", "verify", "a", "--store", str(store.root)), words)
    assert [s.error is not None and words in s.error for s in store.list()] == [True]


def test_verify_refuses_a_lora_config_whose_rank_is_not_its_weights(capsys, saved, tmp_path):
    store = _tampered(saved, tmp_path, "l", lambda d: d.__setitem__("r", 64))
    assert_one_line_error(attnft(capsys, "adapters", "verify", "l", "--store", str(store.root)),
                          "does not describe its weights", "has rank 2, its config's r is 64")
