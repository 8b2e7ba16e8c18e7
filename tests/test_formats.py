"""Adapter folders of every method family: a folder's family is told once, and every family answers the same calls the
same way."""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from attnft.methods.record import AdapterRecord
from attnft.core.errors import AdapterError, ConfigError
from attnft.methods import METHODS, method_of
from attnft.methods.freeze.method import FREEZE as ATTNFT
from attnft.methods.peft.method import PEFT
from attnft.methods.peft.sidecar import is_peft_adapter
from attnft.adapters.store import AdapterStore
from test_store import trained
from tiny_models import tiny_input, tiny_model

REPO = Path(__file__).resolve().parents[1]
LABELS = ["a", "b", "c", "d"]
TRAINING = {"dataset": "colors", "top1": 50.0}


@pytest.fixture(scope="module")
def attnft_trained():
    torch.manual_seed(0)
    return trained(4)


@pytest.fixture(scope="module")
def peft_trained():
    from attnft.methods.peft.model import apply_peft_policy

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft: a timm model has no hub config
        peft_model, report = apply_peft_policy(peft_base(), "lora:r=4")
    with torch.no_grad():  # as training would: LoRA's B starts at zero, which changes nothing
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    return peft_model.eval(), report


def peft_base():
    """The base ``peft_trained`` wraps, created again: the same seed gives the same weights."""
    torch.manual_seed(0)
    return tiny_model("vit", num_classes=4)


@pytest.fixture
def store(tmp_path, attnft_trained, peft_trained):
    """``cars`` in attnft's format and ``cars-lora`` in peft's, saved with the same keywords."""
    store = AdapterStore(tmp_path / "store")
    model, report, snapshot, _ = attnft_trained
    peft_model, peft_report = peft_trained
    same = dict(label_names=LABELS, model_name="vit_small_patch16_224", training=TRAINING)
    store.save("cars", model, report, snapshot, AdapterRecord.of(model, **same), mode="exact")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store.save("cars-lora", peft_model, peft_report, record=AdapterRecord.of(peft_model, **same), mode="exact")
    return store


def test_a_folder_is_told_apart_by_peft_s_sidecar(store):
    assert method_of(store.path("cars")) is ATTNFT and method_of(store.path("cars-lora")) is PEFT
    assert not is_peft_adapter(store.path("cars")) and is_peft_adapter(store.path("cars-lora"))
    assert store.method("cars") is ATTNFT and store.format_name("cars-lora") == "peft"


def test_a_report_picks_the_format_it_is_saved_in(attnft_trained, peft_trained):
    assert method_of(attnft_trained[1]) is ATTNFT and method_of(peft_trained[1]) is PEFT
    with pytest.raises(TypeError, match="is no adapter"):
        method_of({"not": "a report"})


def test_every_family_is_registered_once_and_the_fallback_comes_last():
    families = list(METHODS.values())
    assert families[-1] is ATTNFT and PEFT in families and len(set(map(id, families))) == len(families)
    assert all(name == m.name for name, m in METHODS.items())


def test_a_folder_that_is_no_adapter_gets_attnft_s_errors(tmp_path):
    assert method_of(tmp_path / "missing") is ATTNFT  # its read says what is missing
    with pytest.raises(AdapterError, match="no adapter folder"):
        ATTNFT.config(tmp_path / "missing")


@pytest.mark.parametrize("name", ["cars", "cars-lora"])
def test_both_formats_record_the_same_keywords(store, name):
    fmt = store.method(name)
    config = fmt.verify(store.path(name))
    assert config.label_names == LABELS and config.num_classes == 4 and config.model_name == "vit_small_patch16_224"
    assert (config.training if fmt is ATTNFT else config.metadata) == TRAINING
    assert fmt.config(fmt.read(store.path(name))) == config  # what read returned is passed on, not read again
    summary = fmt.summary(name, store.path(name))
    assert (summary.num_classes, summary.input_size, summary.base_fingerprint) == (4, 32, config.base_fingerprint)
    assert summary.size_bytes == sum(p.stat().st_size for p in store.path(name).iterdir())


def test_serve_returns_the_module_that_reproduces_the_trained_logits(store, attnft_trained, peft_trained):
    model, _, _, base_state = attnft_trained
    base = tiny_model("vit")
    base.load_state_dict(base_state)
    served = {"cars": ATTNFT.load(base.eval(), store.read("cars")), "cars-lora": PEFT.load(peft_base().eval(), store.read("cars-lora"))}
    x = tiny_input(base)
    with torch.no_grad():
        assert served["cars"] is base and torch.equal(served["cars"](x), model(x))
        assert torch.equal(served["cars-lora"](x), peft_trained[0](x))
        assert not torch.equal(served["cars-lora"](x), peft_base().eval()(x))


def test_a_peft_adapter_refuses_delta_mode(tmp_path, peft_trained):
    with pytest.raises(ConfigError, match="attnft adapters"):
        AdapterStore(tmp_path).save("x", *peft_trained, mode="delta")
    assert not (tmp_path / "x").exists()


def test_listing_and_verifying_attnft_adapters_never_imports_peft(tmp_path, attnft_trained):
    model, report, snapshot, _ = attnft_trained
    AdapterStore(tmp_path).save("cars", model, report, snapshot)
    code = (
        "import sys; from attnft import AdapterStore; s = AdapterStore(sys.argv[1]);"
        "s.list(); s.verify('cars'); s.show('cars'); s.read('cars');"
        "assert 'peft' not in sys.modules, 'peft was imported'"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
