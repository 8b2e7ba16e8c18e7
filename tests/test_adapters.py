"""Adapters: save exactly what a policy trained, load it back bit-for-bit, refuse what does not fit."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnft.methods.record import AdapterRecord
from attnft.core.files import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE
from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.methods.fingerprint import compute_fingerprint
from attnft.methods.freeze.load import load_adapter
from attnft.methods.freeze.read import read_adapter, verify_adapter
from attnft.methods.freeze.save import save_adapter
from attnft.core.errors import AdapterError, BaseMismatchError, StoreError
from attnft.adapters.merge import export_adapter
from attnft.methods.freeze.policy import apply_policy
from tiny_models import tiny_input, tiny_model

REPO = Path(__file__).resolve().parents[1]
NUM_CLASSES = 5


def finetune(family="vit", steps=3, lr=1e-2, img_size=None, base_state=None):
    """A tiny base, its state dict, and a copy fine-tuned under ``attn`` for NUM_CLASSES classes.

    Returns (model, report, snapshot, base_state); the model is in eval mode.
    """
    extra = {"img_size": img_size} if img_size else {}
    if base_state is None:
        base_state = {k: v.clone() for k, v in tiny_model(family).state_dict().items()}
    model = tiny_model(family, **extra)
    if img_size:
        from attnft.models.resolution import resample_state_dict

        model.load_state_dict(resample_state_dict(base_state, model))
    else:
        model.load_state_dict(base_state)
    model.reset_classifier(NUM_CLASSES)
    report = apply_policy(model, "attn")
    snapshot = BaseSnapshot.capture(model, report)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    x, y = tiny_input(model, batch=4), torch.arange(4) % NUM_CLASSES
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.eval(), report, snapshot, base_state


def fresh_base(family="vit", base_state=None):
    """The base as a user would create it again: a new model object given the base weights."""
    torch.manual_seed(1234)  # a different random init, overwritten by the weights
    model = tiny_model(family)
    model.load_state_dict(base_state)
    return model.eval()


def other_base(family="vit"):
    """Same architecture, other weights."""
    torch.manual_seed(99)
    return tiny_model(family).eval()


def max_diff(a, b):
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def trained_vit():
    torch.manual_seed(0)
    return finetune("vit")


@pytest.fixture
def saved(tmp_path, trained_vit):
    model, report, snapshot, base_state = trained_vit
    path = tmp_path / "cars"
    save_adapter(path, model, report, snapshot, AdapterRecord.of(model, label_names=[f"c{i}" for i in range(NUM_CLASSES)]))
    return path


# --- round trip ---


@pytest.mark.parametrize("family", ["vit", "deit_distilled", "parallel_scaling", "beit", "swin", "eva", "vit_attn_pool"])
def test_exact_adapter_on_a_fresh_base_reproduces_the_finetuned_logits(tmp_path, family):
    model, report, snapshot, base_state = finetune(family)
    save_adapter(tmp_path / "a", model, report, snapshot)
    base = fresh_base(family, base_state)
    x = tiny_input(model)
    load_adapter(base, tmp_path / "a")
    with torch.no_grad():
        assert torch.equal(base(x), model(x))


def test_adapter_holds_only_the_tensors_the_policy_trained(saved, trained_vit):
    model, report, _, _ = trained_vit
    stored = load_file(saved / WEIGHTS_FILE)
    assert set(stored) == set(report.trainable)
    assert not any(".mlp." in name or "norm" in name for name in stored)


def test_fused_in_proj_stores_only_its_attention_rows_and_keeps_the_base_mlp_rows(tmp_path):
    model, report, snapshot, base_state = finetune("parallel_scaling")
    save_adapter(tmp_path / "a", model, report, snapshot)
    mlp_rows = model.blocks[0].in_split[0]
    in_proj = model.blocks[0].in_proj.weight
    stored = load_file(tmp_path / "a" / WEIGHTS_FILE)["blocks.0.in_proj.weight"]
    assert stored.shape[0] == in_proj.shape[0] - mlp_rows
    base = fresh_base("parallel_scaling", base_state)
    load_adapter(base, tmp_path / "a")
    assert torch.equal(base.blocks[0].in_proj.weight[:mlp_rows], base_state["blocks.0.in_proj.weight"][:mlp_rows])
    assert torch.equal(base.blocks[0].in_proj.weight[mlp_rows:], in_proj[mlp_rows:])


def test_loading_resets_the_classifier_to_the_adapter_classes(saved, trained_vit):
    base = fresh_base("vit", trained_vit[3])
    assert base.num_classes == 1000
    config = load_adapter(base, saved)
    assert base.num_classes == config.num_classes == NUM_CLASSES
    assert base(tiny_input(base)).shape == (2, NUM_CLASSES)


# --- delta mode ---

# Documented bound (module docstring of attnft.adapters): fp16 deltas round each element by at
# most |delta| * 2**-11, bf16 by |delta| * 2**-8. On the tiny ViT fine-tuned below (lr 1e-2,
# logits of order 2) that moved logits by 1.3e-4 (fp16) and 1.1e-3 (bf16); asserted with margin.
DELTA_LOGIT_BOUND = {"float16": 1e-3, "bfloat16": 1e-2}


@pytest.mark.parametrize("delta_dtype", ["float16", "bfloat16"])
def test_delta_adapter_logit_change_is_within_the_documented_bound(tmp_path, trained_vit, delta_dtype):
    model, report, snapshot, base_state = trained_vit
    save_adapter(tmp_path / "exact", model, report, snapshot)
    save_adapter(tmp_path / "delta", model, report, snapshot, mode="delta", delta_dtype=delta_dtype)
    x = torch.randn(16, 3, 32, 32)
    exact, delta = fresh_base("vit", base_state), fresh_base("vit", base_state)
    load_adapter(exact, tmp_path / "exact")
    load_adapter(delta, tmp_path / "delta")
    with torch.no_grad():
        change = max_diff(delta(x), exact(x))
        scale = exact(x).abs().max().item()
    print(f"\n{delta_dtype} delta: worst logit change {change:.3g} (logits up to {scale:.3g})")
    assert change <= DELTA_LOGIT_BOUND[delta_dtype]
    assert (tmp_path / "delta" / WEIGHTS_FILE).stat().st_size < (tmp_path / "exact" / WEIGHTS_FILE).stat().st_size


def test_delta_mode_stores_the_head_and_position_embedding_exactly(tmp_path, trained_vit):
    model, report, snapshot, _ = trained_vit
    config = save_adapter(tmp_path / "d", model, report, snapshot, mode="delta")
    stored = load_file(tmp_path / "d" / WEIGHTS_FILE)
    for name in ("head.weight", "head.bias", "pos_embed"):
        assert config.tensors[name]["stored"] == "exact"
        assert torch.equal(stored[name], dict(model.named_parameters())[name].detach())
    assert config.tensors["blocks.0.attn.qkv.weight"]["stored"] == "delta"
    assert stored["blocks.0.attn.qkv.weight"].dtype == torch.float16


# --- identity ---


def test_fingerprint_is_the_same_in_another_process(tmp_path, trained_vit):
    base_state = trained_vit[3]
    save_file(base_state, str(tmp_path / "base.safetensors"))
    code = (
        "import sys; sys.path.insert(0, 'tests');"
        "from safetensors.torch import load_file; from tiny_models import tiny_model;"
        "from attnft.methods.fingerprint import compute_fingerprint;"
        f"m = tiny_model('vit'); m.load_state_dict(load_file({str(tmp_path / 'base.safetensors')!r})); print(compute_fingerprint(m))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, env=_env())
    assert out.stdout.strip() == compute_fingerprint(fresh_base("vit", base_state))


def test_fingerprint_ignores_the_head_and_the_input_size(trained_vit):
    from attnft.models.resolution import resample_state_dict

    base_state = trained_vit[3]
    base = fresh_base("vit", base_state)
    other_head = fresh_base("vit", base_state)
    other_head.reset_classifier(7)
    at_64 = tiny_model("vit", img_size=64)
    at_64.load_state_dict(resample_state_dict(base_state, at_64))
    assert compute_fingerprint(base) == compute_fingerprint(other_head) == compute_fingerprint(at_64)


def test_fingerprint_changes_with_any_frozen_weight(trained_vit):
    base = fresh_base("vit", trained_vit[3])
    before = compute_fingerprint(base)
    with torch.no_grad():
        base.blocks[1].mlp.fc2.bias[0] += 1e-6
    assert compute_fingerprint(base) != before


def test_adapter_onto_another_base_of_the_same_architecture_is_refused_naming_the_expected_base(saved, trained_vit):
    other = other_base()
    before = {k: v.clone() for k, v in other.state_dict().items()}
    expected = json.loads((saved / CONFIG_FILE).read_text())["base_fingerprint"]
    with pytest.raises(BaseMismatchError) as error:
        load_adapter(other, saved)
    message = str(error.value)
    assert "vit_small_patch16_224" in message and expected[:12] in message and "\n" not in message
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())  # untouched


def test_ignore_fingerprint_loads_onto_another_base(saved):
    other = other_base()
    load_adapter(other, saved, ignore_fingerprint=True)
    assert torch.equal(other.blocks[0].attn.qkv.weight, load_file(saved / WEIGHTS_FILE)["blocks.0.attn.qkv.weight"])


def test_save_refuses_a_model_whose_frozen_weights_left_the_base_snapshot(tmp_path):
    model, report, snapshot, _ = finetune("vit", steps=1)
    with torch.no_grad():
        model.blocks[0].mlp.fc1.weight[0, 0] += 0.1  # a frozen weight moved after the snapshot
    with pytest.raises(AdapterError, match="no longer match the base snapshot"):
        save_adapter(tmp_path / "a", model, report, snapshot)
    assert not list(tmp_path.iterdir())


# --- resolution ---


@pytest.mark.parametrize("family", ["vit", "beit"])
def test_adapter_trained_at_another_resolution_loads_onto_a_base_created_at_checkpoint_size(tmp_path, family):
    base_state = {k: v.clone() for k, v in tiny_model(family).state_dict().items()}
    model, report, snapshot, _ = finetune(family, img_size=64, base_state=base_state)
    config = save_adapter(tmp_path / "a64", model, report, snapshot)
    assert config.input_size == 64
    base = fresh_base(family, base_state)  # created at 32
    load_adapter(base, tmp_path / "a64")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(base(x), model(x))


def test_model_that_takes_any_input_size_loads_an_adapter_of_another_size_as_it_is(tmp_path):
    model, report, snapshot, base_state = finetune("pvt_v2")
    save_adapter(tmp_path / "a", model, report, snapshot, AdapterRecord.of(model, input_size=64))  # as a runner at 64 px records it
    base = fresh_base("pvt_v2", base_state)
    load_adapter(base, tmp_path / "a")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(base(x), model(x))


def test_model_that_cannot_change_size_is_told_which_size_to_create(tmp_path):
    base_state = {k: v.clone() for k, v in tiny_model("cait").state_dict().items()}
    model, report, snapshot, _ = finetune("cait", img_size=64, base_state=base_state)
    save_adapter(tmp_path / "a64", model, report, snapshot)
    with pytest.raises(AdapterError, match="img_size=64"):
        load_adapter(fresh_base("cait", base_state), tmp_path / "a64")


# --- refusing bad input (truncated files, broken headers, missing configs: tests/test_adapters_cli.py) ---


def test_a_flipped_data_byte_fails_the_checksum(saved):
    weights = saved / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(AdapterError, match="sha256"):
        verify_adapter(saved)


def test_stated_num_classes_or_policy_that_differ_are_refused(saved, trained_vit):
    base = fresh_base("vit", trained_vit[3])
    with pytest.raises(AdapterError, match="classes"):
        load_adapter(base, saved, num_classes=10)
    with pytest.raises(AdapterError, match="policy"):
        load_adapter(base, saved, policy="ffn")
    assert base.num_classes == 1000  # refused before the model changed


def test_adapter_missing_a_trained_tensor_is_refused(saved, trained_vit):
    adapter = read_adapter(saved)
    del adapter.tensors["blocks.1.attn.proj.weight"]
    del adapter.config.tensors["blocks.1.attn.proj.weight"]
    with pytest.raises(AdapterError, match="missing 1"):
        load_adapter(fresh_base("vit", trained_vit[3]), adapter)


def test_adapter_with_a_tensor_its_policy_does_not_train_is_refused(saved, trained_vit):
    adapter = read_adapter(saved)
    adapter.config.tensors["norm.weight"] = {"shape": [32], "region": None, "stored": "exact", "role": "norm"}
    adapter.tensors["norm.weight"] = torch.ones(32)
    with pytest.raises(AdapterError, match="unknown to this model"):
        load_adapter(fresh_base("vit", trained_vit[3]), adapter)


def test_save_refuses_to_overwrite_without_the_flag(saved, trained_vit):
    model, report, snapshot, _ = trained_vit
    before = {p.name: p.read_bytes() for p in saved.iterdir()}
    with pytest.raises(StoreError, match="overwrite"):
        save_adapter(saved, model, report, snapshot, mode="delta")
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == before
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]  # no temporary left


def test_save_with_overwrite_replaces_the_adapter(saved, trained_vit):
    model, report, snapshot, _ = trained_vit
    save_adapter(saved, model, report, snapshot, mode="delta", overwrite=True)
    assert read_adapter(saved).config.mode == "delta"
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]


class _Canary:
    """Unpickling this creates a file: proof that something unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_reading_an_adapter_never_unpickles(saved, tmp_path):
    canary = tmp_path / "unpickled"
    weights = saved / WEIGHTS_FILE
    torch.save({"x": _Canary(str(canary))}, weights)
    config = json.loads((saved / CONFIG_FILE).read_text())
    import hashlib

    config["weights_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    config["weights_bytes"] = weights.stat().st_size
    (saved / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(AdapterError):
        read_adapter(saved)
    assert not canary.exists()


# --- model card ---


def test_each_adapter_folder_has_a_hub_model_card(saved):
    from huggingface_hub import ModelCard

    card = ModelCard.load(saved / CARD_FILE)
    assert card.data.library_name == "attnft"
    assert "attnft" in card.data.tags and "image-classification" in card.data.tags
    assert card.data.base_model and card.data.license
    assert "vit_small_patch16_224" in card.text


# --- merge and export ---


def test_exported_checkpoint_loads_in_plain_timm_without_attnft(saved, trained_vit, tmp_path):
    model, _, _, base_state = trained_vit
    x = torch.randn(3, 3, 32, 32)
    save_file({"x": x}, str(tmp_path / "x.safetensors"))
    export = export_adapter(saved, tmp_path / "export", base_model=fresh_base("vit", base_state))
    # the call from the issue, plus the tiny model's architecture kwargs read from timm's config.json
    code = f"""
import json, sys, timm, torch
from safetensors.torch import load_file
cfg = json.load(open({str(export.folder / 'config.json')!r}))
args = cfg["model_args"]
model = timm.create_model(cfg["architecture"], pretrained=True,
    pretrained_cfg_overlay=dict(file={str(export.weights)!r}, num_classes=args.pop("num_classes")),
    num_classes=cfg["num_classes"], img_size=args.pop("img_size"), **args).eval()
with torch.no_grad():
    logits = model(load_file({str(tmp_path / 'x.safetensors')!r})["x"])
assert not any(m == "attnft" or m.startswith("attnft.") for m in sys.modules), "attnft was imported"
print(json.dumps(logits.tolist()))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=_env(attnft_on_path=False))
    assert out.returncode == 0, out.stderr
    with torch.no_grad():
        assert torch.equal(torch.tensor(json.loads(out.stdout)), model(x))


def test_export_onto_another_base_writes_nothing(saved, tmp_path):
    with pytest.raises(BaseMismatchError):
        export_adapter(saved, tmp_path / "export", base_model=other_base())
    assert not (tmp_path / "export").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_export_refuses_an_existing_folder_without_the_flag(saved, trained_vit, tmp_path):
    (tmp_path / "export").mkdir()
    with pytest.raises(StoreError, match="overwrite"):
        export_adapter(saved, tmp_path / "export", base_model=fresh_base("vit", trained_vit[3]))
    assert list((tmp_path / "export").iterdir()) == []


def _env(attnft_on_path=True):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    if attnft_on_path:
        env["PYTHONPATH"] = str(REPO)
    return env
