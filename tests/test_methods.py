"""One method interface: a spec is a freezing policy or a peft method, decided once by parse_method."""
import subprocess
import sys
import warnings

import pytest
import torch
from peft import PeftModel
from timm.optim import create_optimizer_v2
from torch import nn

from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.methods.fingerprint import compute_fingerprint
from attnft.core.errors import UnknownPolicyError
from attnft.methods import method_for_spec, parse_method
from attnft.methods.freeze.method import FREEZE, FreezeTuning
from attnft.methods.peft.method import PEFT, PeftTuning
from attnft.methods.peft.spec import LoraOptions
from tiny_models import tiny_input, tiny_model


@pytest.fixture(autouse=True)
def _quiet():
    # peft warns that a timm model has no hub config; nothing to act on here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize(
    "spec, kind, blocks",
    [("attn", FreezeTuning, None), ("attn+norm@0-1", FreezeTuning, {0, 1}), ("lora", PeftTuning, None),
     ("lora:r=4", PeftTuning, None), ("ia3", PeftTuning, None), ("lora+ffn@1", PeftTuning, {1})],
)
def test_a_spec_is_a_freezing_policy_or_a_peft_method(spec, kind, blocks):
    method = parse_method(spec)
    assert type(method) is kind and method.method is method_for_spec(spec) is (PEFT if kind is PeftTuning else FREEZE)
    assert method.spec == method.name == spec and method.blocks == blocks


def test_peft_options_are_parsed_with_the_method():
    assert parse_method("lora:r=4").policy.options == LoraOptions(r=4)


@pytest.mark.parametrize("spec", ["atn", "attn+nrom", "lorra", "lora+norm", "lora:rank=4", "ia3@x", ""])
def test_a_typo_is_a_policy_error(spec):
    with pytest.raises(UnknownPolicyError):
        parse_method(spec)


def test_parsing_imports_no_peft():
    """peft takes seconds to import: a typo is reported before, and a freezing policy never needs it."""
    code = (
        "import sys\n"
        "from attnft.core.errors import UnknownPolicyError\n"
        "from attnft.methods import parse_method\n"
        "parse_method('attn+norm@0-1'), parse_method('lora+ffn:r=4')\n"
        "try:\n    parse_method('lora:rank=4')\nexcept UnknownPolicyError:\n    pass\n"
        "assert 'peft' not in sys.modules, 'peft was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("spec", ["attn@2", "lora@0,2"])
def test_blocks_the_model_lacks_are_a_policy_error(spec):
    method = parse_method(spec)
    method.check_blocks(3, "a 3-block model")
    with pytest.raises(UnknownPolicyError, match="2"):
        method.check_blocks(2, "a 2-block model")


def _one_step(applied, weight_decay=0.05):
    """One AdamW step through timm's optimizer factory: (names the optimizer holds, names that moved)."""
    optimizer = create_optimizer_v2(applied.optimizer_params(weight_decay), opt="adamw", lr=1e-2, weight_decay=weight_decay)
    params = dict(applied.model.named_parameters())
    before = {name: p.detach().clone() for name, p in params.items()}
    applied.model.train()
    nn.functional.cross_entropy(applied.model(tiny_input(applied.backbone, batch=4)), torch.arange(4)).backward()
    optimizer.step()
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return {n for n, p in params.items() if id(p) in held}, {n for n, p in params.items() if not torch.equal(p, before[n])}


@pytest.mark.parametrize("spec", ["attn", "attn+norm@0"])
def test_a_freezing_policy_trains_the_model_itself_exactly_where_its_report_says(spec):
    model = tiny_model("vit", num_classes=4)
    fingerprint = compute_fingerprint(model)
    applied = parse_method(spec).apply(model)
    assert applied.model is model and applied.backbone is model and applied.optimizer_params(0.05) is model
    assert isinstance(applied.base, BaseSnapshot) and applied.base.fingerprint == fingerprint
    assert set(applied.base.start_values) == set(applied.report.trainable)
    held, moved = _one_step(applied)
    assert held == set(applied.report.trainable) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert moved and moved <= held


@pytest.mark.parametrize("spec", ["lora:r=4", "ia3+ffn"])
def test_a_peft_method_trains_the_adapter_and_head_copy_exactly(spec):
    model = tiny_model("vit", num_classes=4)
    fingerprint = compute_fingerprint(model)
    applied = parse_method(spec).apply(model)
    assert isinstance(applied.model, PeftModel) and applied.backbone is model is applied.model.get_base_model()
    assert applied.base is None and applied.report.base_fingerprint == fingerprint
    groups = applied.optimizer_params(0.05)
    assert [g["weight_decay"] for g in groups] == [0.0, 0.05]
    held, moved = _one_step(applied)
    trainable = {n for n, p in applied.model.named_parameters() if p.requires_grad}
    assert held == trainable and sum(p.numel() for n, p in applied.model.named_parameters() if n in held) == applied.report.num_trainable
    assert moved and moved <= held
