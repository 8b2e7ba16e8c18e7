"""``adapters verify`` refuses an adapter whose input size its base cannot take (issue 31, section 2): the position
table it stores must have the grid of its input size on that base, and the base must take images of that size.
The base is rebuilt on the meta device from the recorded name and arguments: nothing is read or downloaded."""
import json
import warnings

import pytest

from attnft.core.files import CONFIG_FILE
from attnft.adapters.store import AdapterStore
from attnft.cli import main
from attnft.core.errors import AdapterError
from attnft.methods import parse_method
from attnft.methods.record import AdapterRecord
from attnft.models import create_model
from tiny_models import tiny_model


def _saved(tmp_path, model, name="task"):
    applied = parse_method("attn").apply(model)
    store = AdapterStore(tmp_path / "store")
    store.save(name, applied.model, applied.report, applied.base, AdapterRecord.of(model))
    return store


def _resize(store, name, size):
    path = store.path(name) / CONFIG_FILE
    data = json.loads(path.read_text())
    data["input_size"] = size
    data["data_config"]["input_size"] = [3, size, size]
    path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def default_base():
    return create_model("vit_fmnist_patch16_224")  # the bundled default: 16 px patches, a 14 x 14 position table


@pytest.mark.parametrize("size, why", [(28, "image size 28 does not fit"),  # a 28 px data config on the 224 base
                                       (96, "pos_embed has shape"), (448, "pos_embed has shape")])  # another grid
def test_a_size_whose_grid_the_position_table_is_not_is_refused_by_field(tmp_path, capsys, default_base, size, why):
    store = _saved(tmp_path, default_base)
    assert store.verify("task").input_size == 224  # as saved: it fits
    _resize(store, "task", size)
    with pytest.raises(AdapterError, match=f"input_size {size}: {why}"):
        store.verify("task")
    assert main(["adapters", "verify", "task", "--store", str(store.root)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"input_size {size}" in err


def test_a_size_the_base_cannot_take_is_refused(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = _saved(tmp_path, tiny_model("swin"))  # 4 px patches, windows of 4: sizes must be multiples of 8 here
    _resize(store, "task", 36)
    with pytest.raises(AdapterError, match="input_size 36: image size 36 does not fit"):
        store.verify("task")
    _resize(store, "task", 40)  # a size it takes: the window tables do not depend on it
    assert store.verify("task").input_size == 40


def test_a_base_that_cannot_be_rebuilt_here_is_left_to_the_load(tmp_path, default_base):
    store = _saved(tmp_path, default_base)
    path = store.path("task") / CONFIG_FILE
    data = json.loads(path.read_text())
    data["model_name"] = "hf-hub:nobody/not-here"  # offline here: only its load can say
    path.write_text(json.dumps(data))
    assert store.verify("task").model_name == "hf-hub:nobody/not-here"
