"""Adapters saved by attnft before its modules were regrouped by layer (main 3d0127a) still verify, list and load,
giving the logits they gave then (tests/fixtures/write_main_adapters.py wrote them)."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from attnft.adapters.store import AdapterStore
from fixtures.write_main_adapters import base, batch  # the base and batch the fixtures were written with

SAVED = Path(__file__).resolve().parent / "fixtures" / "main-3d0127a"
LOGITS = json.loads((SAVED / "logits.json").read_text())


@pytest.fixture
def store(tmp_path):
    shutil.copytree(SAVED, tmp_path / "store")  # a copy: reading must not need to write, but a test may
    return AdapterStore(tmp_path / "store")


def test_both_formats_saved_before_the_regrouping_verify_and_list(store):
    assert {name: store.format_name(name) for name in store.names()} == {"vit-attn": "attnft", "vit-lora": "peft"}
    for name in store.names():
        store.verify(name)
    assert all(summary.error is None for summary in store.list())


@pytest.mark.parametrize("name", ["vit-attn", "vit-lora"])
def test_an_adapter_saved_before_the_regrouping_loads_to_the_same_logits(store, name):
    model = base()
    loaded = store.load(name, model)
    served = model if name == "vit-attn" else loaded
    with torch.no_grad():
        torch.testing.assert_close(served.eval()(batch()), torch.tensor(LOGITS[name]))
