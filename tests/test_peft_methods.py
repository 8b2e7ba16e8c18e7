"""peft methods on the role map's modules: targets, training, saving in peft's format, multi-task serving
(:class:`attnft.multitask.PeftMultiTask`)."""
import copy
import json
import warnings

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

from attnft.methods.record import AdapterRecord
from attnft.core.errors import AdapterError, BaseMismatchError, StoreError, UnknownPolicyError
from attnft.methods.peft.spec import IA3Options, LoraOptions, PeftPolicy
from attnft.multitask import PeftMultiTask
from attnft.methods.peft.targets import adapted_modules
from attnft.methods.peft.model import apply_peft_policy, param_groups
from attnft.methods.peft.sidecar import is_peft_adapter, read_peft_adapter
from attnft.methods.peft.files import load_peft_adapter, save_peft_adapter, verify_peft_adapter
from attnft.methods.peft.targets import peft_target_modules
from attnft.methods.freeze.policy import apply_policy
from attnft.roles import Role, build_role_map
from test_roles_transformers import FAMILIES as TRANSFORMERS_FAMILIES
from tiny_models import TINY_MODELS, tiny_input, tiny_model

ATTENTION_PEFT_POLICIES = ["lora", "lora:r=2,alpha=4,dropout=0.1", "lora@0", "lora-head", "ia3", "ia3@1"]


@pytest.fixture(autouse=True)
def _quiet():
    # peft warns that a timm model has no hub config; nothing to act on here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _finetune(model: nn.Module, steps: int = 3, num_classes: int = 4) -> None:
    """A few AdamW steps on a fixed random batch, so every adapter tensor moves from its init."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    x = tiny_input(model, batch=4)
    y = torch.arange(4) % num_classes
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def _trained_lora(family="vit", spec="lora:r=4,alpha=8", num_classes=4, seed=0):
    """(untouched copy of the base, fine-tuned peft model, report)."""
    torch.manual_seed(seed)
    model = tiny_model(family, num_classes=num_classes)
    base = copy.deepcopy(model)
    peft_model, report = apply_peft_policy(model, spec)
    _finetune(peft_model, num_classes=num_classes)
    return base, peft_model, report


# --- the spec ---------------------------------------------------------------------------------


def test_spec_reads_method_roles_blocks_and_options():
    policy = PeftPolicy.parse("lora+ffn@8-11:r=16,alpha=32,dropout=0.1,rslora=true")
    assert policy.method == "lora"
    assert policy.roles == {Role.ATTENTION, Role.FFN}
    assert policy.blocks == {8, 9, 10, 11}
    assert policy.options == LoraOptions(r=16, alpha=32.0, dropout=0.1, rslora=True)
    assert policy.head


def test_spec_defaults_to_attention_with_the_head_trained():
    policy = PeftPolicy.parse("ia3")
    assert policy.roles == {Role.ATTENTION} and policy.head and policy.blocks is None
    assert policy.options == IA3Options()


def test_spec_can_drop_attention_or_the_head():
    assert PeftPolicy.parse("lora+ffn-attn").roles == {Role.FFN}
    assert not PeftPolicy.parse("lora-head").head


@pytest.mark.parametrize(
    "spec",
    ["loraa", "lora+norm", "lora+patch_embed", "lora-attn", "lora:rank=4", "lora:r=four", "lora:r=0",
     "lora:dropout=1.5", "lora:bias=all", "ia3:r=4", "lora@x"],
)
def test_a_bad_spec_is_a_policy_error(spec):
    with pytest.raises(UnknownPolicyError):
        PeftPolicy.parse(spec)


# --- what is targeted ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(TINY_MODELS))
def test_no_attention_policy_targets_a_non_attention_module(family):
    """Every policy meant for attention, on every family: what it adapts or trains is attention (or the head)."""
    _check_only_attention_is_targeted(tiny_model(family))


@pytest.mark.parametrize("family", sorted(TRANSFORMERS_FAMILIES))
def test_no_attention_policy_targets_a_non_attention_module_of_a_transformers_model(family):
    """The same on transformers' families, whose FFN linears are also called ``output.dense`` / ``mlp.fc*``."""
    _check_only_attention_is_targeted(TRANSFORMERS_FAMILIES[family]())


def _check_only_attention_is_targeted(model):
    role_map = build_role_map(model)

    # the freezing policy: trainable tensors are attention, head or position embedding
    report = apply_policy(copy.deepcopy(model), "attn")
    for name in report.trainable:
        roles = {e.role for e in role_map.of(name) if e.region == report.trainable[name]}
        assert roles <= {Role.ATTENTION, Role.HEAD, Role.POS_EMBED}, (name, roles)
        assert Role.PATCH_EMBED not in {e.role for e in role_map.of(name)}, name

    # peft policies: resolve what peft really wrapped, check each module against the role map
    modules = dict(model.named_modules())
    for spec in ATTENTION_PEFT_POLICIES:
        peft_model, _ = apply_peft_policy(copy.deepcopy(model), spec)
        adapted = adapted_modules(peft_model)
        assert any(kind == "adapter" for kind in adapted.values()), spec
        for name, kind in adapted.items():
            params = [f"{name}.{p}" for p, _ in modules[name].named_parameters()]
            expected = Role.ATTENTION if kind == "adapter" else Role.HEAD
            assert params and all(e.role == expected for p in params for e in role_map.of(p)), (spec, name, kind)
        # and everything that trains hangs off those modules
        for param_name, param in peft_model.get_base_model().named_parameters():
            if param.requires_grad:
                assert any(param_name.startswith(f"{m}.") for m in adapted), (spec, param_name)


def test_a_bare_proj_target_in_plain_peft_does_catch_the_patch_embedding():
    """Why the role map picks exact names: peft's suffix match on 'proj' also wraps patch_embed.proj."""
    model = tiny_model("vit")
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["qkv", "proj"]))
    assert "patch_embed.proj" in adapted_modules(peft_model)


def test_ffn_on_request_adds_exactly_the_ffn_modules():
    model = tiny_model("vit")
    role_map = build_role_map(model)
    attention = set(role_map.modules_with_role(model, Role.ATTENTION))
    ffn = set(role_map.modules_with_role(model, Role.FFN))
    _, both = apply_peft_policy(copy.deepcopy(model), "lora+ffn")
    _, only_ffn = apply_peft_policy(copy.deepcopy(model), "lora+ffn-attn")
    assert set(both.targets.modules) == attention | ffn
    assert set(only_ffn.targets.modules) == ffn
    assert {both.targets.modules[n] for n in ffn} == {Role.FFN}


def test_blocks_limit_the_adapted_modules():
    _, report = apply_peft_policy(tiny_model("vit"), "lora@1")
    assert list(report.targets.modules) == ["blocks.1.attn.qkv", "blocks.1.attn.proj"]


def test_ia3_scales_the_input_of_ffn_modules_and_the_output_of_attention():
    peft_model, report = apply_peft_policy(tiny_model("vit"), "ia3+ffn")
    layers = dict(peft_model.get_base_model().named_modules())
    assert layers["blocks.0.mlp.fc2"].is_feedforward
    assert not layers["blocks.0.attn.qkv"].is_feedforward


def test_lora_skips_grouped_convolutions_and_reports_what_stays_frozen():
    """MViTv2's depthwise pooling convs are attention but not projections LoRA can wrap."""
    model = tiny_model("mvitv2")
    _, report = apply_peft_policy(copy.deepcopy(model), "lora")
    assert not any(".pool_" in name for name in report.targets.modules)
    assert any(".pool_q." in name for name in report.targets.untargeted)
    _, ia3 = apply_peft_policy(copy.deepcopy(model), "ia3")
    assert any(".pool_q" in name for name in ia3.targets.modules)


def test_head_modules_are_the_smallest_modules_holding_the_head():
    _, swin = apply_peft_policy(tiny_model("swin"), "lora")
    _, attn_pool = apply_peft_policy(tiny_model("vit_attn_pool"), "lora")
    _, deit = apply_peft_policy(tiny_model("deit_distilled"), "lora")
    assert swin.targets.head == ["head.fc"]
    assert attn_pool.targets.head == ["attn_pool", "head"]
    assert deit.targets.head == ["head", "head_dist"]


def test_target_names_become_a_regex_when_a_nested_path_repeats_one():
    """peft matches list entries as dotted suffixes; a nested copy of a path must not be caught."""
    model = nn.Module()
    model.blocks = nn.ModuleList([nn.Linear(4, 4)])
    model.extra = nn.Module()
    model.extra.blocks = nn.ModuleList([nn.Linear(4, 4)])
    assert peft_target_modules(model, ["extra.blocks.0"]) == ["extra.blocks.0"]
    targets = peft_target_modules(model, ["blocks.0"])
    assert isinstance(targets, str)
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=targets))
    assert set(adapted_modules(peft_model)) == {"blocks.0"}


# --- training ----------------------------------------------------------------------------------


def test_only_the_adapter_and_the_head_copy_train():
    peft_model, report = apply_peft_policy(tiny_model("vit"), "lora")
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n or ".modules_to_save." in n for n in trainable)
    assert sum(p.numel() for p in peft_model.parameters() if p.requires_grad) == report.num_trainable


def test_ia3_scales_and_biases_are_not_decayed_lora_matrices_are():
    def groups(spec):
        peft_model, _ = apply_peft_policy(tiny_model("vit", num_classes=4), spec)
        no_decay, decay = param_groups(peft_model, weight_decay=0.05)
        names = {id(p): n for n, p in peft_model.named_parameters()}
        assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
        trainable = sorted(n for n, p in peft_model.named_parameters() if p.requires_grad)
        no_decay, decay = (sorted(names[id(p)] for p in group["params"]) for group in (no_decay, decay))
        assert sorted(no_decay + decay) == trainable  # every trainable tensor, once
        return no_decay, decay

    head = "base_model.model.head.modules_to_save.default"
    no_decay, decay = groups("ia3")
    assert decay == [f"{head}.weight"]  # the scales start at 1: decay would pull them to 0
    assert f"{head}.bias" in no_decay and sum(".ia3_l." in n for n in no_decay) == 4  # qkv, proj of 2 blocks
    no_decay, decay = groups("lora")
    assert no_decay == [f"{head}.bias"]
    assert len(decay) == 2 * 4 + 1 and all(".lora_" in n or ".modules_to_save." in n for n in decay)


def test_report_counts_lora_parameters_per_role():
    model = tiny_model("vit", num_classes=4)  # embed_dim 32: qkv 32->96, proj 32->32
    peft_model, report = apply_peft_policy(model, "lora:r=4")
    counts = {row.role: row for row in report.counts()}
    assert counts[Role.ATTENTION].trainable == 2 * (4 * (32 + 96) + 4 * (32 + 32))
    assert counts[Role.HEAD].trainable == 32 * 4 + 4
    assert counts[Role.FFN].trainable == 0 and counts[Role.PATCH_EMBED].trainable == 0
    assert report.to_dict()["trainable"] == report.num_trainable
    assert "lora on 4 modules" in report.format_table()


def test_finetuning_changes_the_logits_and_leaves_the_base_weights():
    base, peft_model, _ = _trained_lora()
    x = tiny_input(base)
    with torch.no_grad():
        assert (peft_model(x) - base.eval()(x)).abs().max() > 1e-3
        with peft_model.disable_adapter():
            base_state = {k.replace("base_layer.", ""): v for k, v in peft_model.get_base_model().state_dict().items()}
    for name, value in base.state_dict().items():
        if not name.startswith("head"):
            assert torch.equal(base_state[name], value), name


# --- saving and loading ------------------------------------------------------------------------


def test_finetuned_lora_reloads_with_plain_peft_and_attnft_to_the_same_logits(tmp_path):
    base, peft_model, report = _trained_lora()
    x = tiny_input(base)
    with torch.no_grad():
        trained = peft_model(x)
    save_peft_adapter(peft_model, report, tmp_path / "cars")

    plain = PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path / "cars")).eval()
    ours = load_peft_adapter(copy.deepcopy(base), tmp_path / "cars")
    with torch.no_grad():
        by_peft, by_attnft = plain(x), ours(x)
    assert torch.equal(by_peft, by_attnft)
    assert (by_peft - trained).abs().max() <= 1e-6


def test_the_folder_is_peft_format_with_an_attnft_sidecar(tmp_path):
    base, peft_model, report = _trained_lora()
    info = save_peft_adapter(peft_model, report, tmp_path / "a", AdapterRecord.of(peft_model, label_names=["a", "b", "c", "d"]))
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"
    assert sorted(config["target_modules"]) == sorted(report.targets.modules)
    assert config["modules_to_save"] == ["head"]
    assert is_peft_adapter(tmp_path / "a")
    assert read_peft_adapter(tmp_path / "a") == info
    assert info.base_fingerprint == report.base_fingerprint
    assert info.num_classes == 4 and info.label_names == ["a", "b", "c", "d"] and info.input_size == 32
    assert info.weights_bytes == report.adapter_bytes(peft_model)


def test_ia3_adapter_round_trips(tmp_path):
    base, peft_model, report = _trained_lora(spec="ia3+ffn")
    x = tiny_input(base)
    with torch.no_grad():
        trained = peft_model(x)
    save_peft_adapter(peft_model, report, tmp_path / "ia3")
    with torch.no_grad():
        reloaded = load_peft_adapter(copy.deepcopy(base), tmp_path / "ia3")(x)
    assert (reloaded - trained).abs().max() <= 1e-6


def test_an_adapter_of_another_base_is_refused(tmp_path):
    _, peft_model, report = _trained_lora()
    save_peft_adapter(peft_model, report, tmp_path / "a")
    torch.manual_seed(1)
    other = tiny_model("vit", num_classes=4)
    with pytest.raises(BaseMismatchError):
        load_peft_adapter(other, tmp_path / "a")


def test_a_base_with_another_class_count_gets_the_adapters_head(tmp_path):
    base, peft_model, report = _trained_lora()
    x = tiny_input(base)
    with torch.no_grad():
        trained = peft_model(x)
    save_peft_adapter(peft_model, report, tmp_path / "a")
    other_head = copy.deepcopy(base)
    other_head.reset_classifier(10)
    with torch.no_grad():
        logits = load_peft_adapter(other_head, tmp_path / "a")(x)
    assert logits.shape == (x.shape[0], 4)
    assert (logits - trained).abs().max() <= 1e-6


def test_an_existing_folder_is_replaced_only_with_overwrite(tmp_path):
    _, peft_model, report = _trained_lora()
    _, other_model, other_report = _trained_lora(spec="lora+ffn:r=2")
    save_peft_adapter(peft_model, report, tmp_path / "a")
    with pytest.raises(StoreError):
        save_peft_adapter(other_model, other_report, tmp_path / "a")
    assert read_peft_adapter(tmp_path / "a").policy == "lora:r=4,alpha=8"
    save_peft_adapter(other_model, other_report, tmp_path / "a", overwrite=True)
    assert read_peft_adapter(tmp_path / "a").policy == "lora+ffn:r=2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no temporary folder left


def test_a_corrupted_weights_file_is_refused(tmp_path):
    base, peft_model, report = _trained_lora()
    save_peft_adapter(peft_model, report, tmp_path / "a")
    weights = tmp_path / "a" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(AdapterError, match="sha256"):
        verify_peft_adapter(tmp_path / "a")
    with pytest.raises(AdapterError, match="sha256"):
        load_peft_adapter(copy.deepcopy(base), tmp_path / "a")


def test_a_folder_without_the_sidecar_is_not_an_attnft_peft_adapter(tmp_path):
    _, peft_model, _ = _trained_lora()
    peft_model.save_pretrained(str(tmp_path / "plain"))
    assert not is_peft_adapter(tmp_path / "plain")
    with pytest.raises(AdapterError):
        read_peft_adapter(tmp_path / "plain")


# --- several tasks on one base ------------------------------------------------------------------


def _saved_tasks(tmp_path, family, specs, num_classes=(4, 4, 4)):
    """One base, one adapter folder per task: (base, {task: folder}, {task: logits of the task alone})."""
    torch.manual_seed(0)
    base = tiny_model(family, num_classes=num_classes[0])
    x = tiny_input(base, batch=6)
    folders, alone = {}, {}
    for i, (spec, classes) in enumerate(zip(specs, num_classes)):
        model = copy.deepcopy(base)
        model.reset_classifier(classes)
        torch.manual_seed(10 + i)
        peft_model, report = apply_peft_policy(model, spec)
        _finetune(peft_model, num_classes=classes)
        folders[f"task{i}.v1"] = save_peft_adapter(peft_model, report, tmp_path / f"task{i}").path
        with torch.no_grad():
            alone[f"task{i}.v1"] = peft_model(x)
    return base, x, folders, alone


def _check_mixed(served, x, alone, tasks):
    rows = served(x, tasks=tasks)
    assert len(rows) == len(tasks)
    for i, task in enumerate(tasks):
        assert (rows[i] - alone[task][i]).abs().max() <= 1e-5, (i, task)


def test_a_mixed_lora_batch_runs_once_through_peft_and_matches_each_adapter_alone(tmp_path):
    base, x, folders, alone = _saved_tasks(tmp_path, "vit", ["lora", "lora+ffn:r=2", "lora@1"])
    served = PeftMultiTask.from_adapters(copy.deepcopy(base), folders)
    tasks = ["task0.v1", "task1.v1", "task2.v1", "task1.v1", "task0.v1", "task2.v1"]
    assert served._peft_can_mix(set(tasks))
    _check_mixed(served, x, alone, tasks)
    assert served._batch_axis_kept  # peft's adapter_names path ran, no fallback
    for task in folders:
        assert (served(x, task=task) - alone[task]).abs().max() <= 1e-5


@pytest.mark.parametrize(
    "family, specs",
    [("swin", ["lora", "lora"]),  # windows fold the batch axis: peft refuses, attnft splits by task
     ("beit", ["lora", "lora"]),  # fc_norm is a LayerNorm head: peft cannot mix it
     ("vit", ["ia3", "ia3+ffn"])],  # IA3 has no mixed batches in peft
)
def test_a_mixed_batch_peft_cannot_run_is_split_by_task_and_matches(tmp_path, family, specs):
    base, x, folders, alone = _saved_tasks(tmp_path, family, specs, num_classes=(4, 4))
    served = PeftMultiTask.from_adapters(copy.deepcopy(base), folders)
    _check_mixed(served, x, alone, ["task0.v1", "task1.v1", "task1.v1", "task0.v1", "task1.v1", "task0.v1"])
    if family == "swin":
        assert served._batch_axis_kept is False  # the probe saw windows on the batch axis


def test_tasks_with_different_class_counts_share_a_mixed_batch(tmp_path):
    base, x, folders, alone = _saved_tasks(tmp_path, "vit", ["lora", "lora", "lora+ffn"], num_classes=(4, 7, 3))
    served = PeftMultiTask.from_adapters(copy.deepcopy(base), folders)
    tasks = ["task1.v1", "task0.v1", "task2.v1", "task1.v1", "task0.v1", "task2.v1"]
    rows = served(x, tasks=tasks)
    assert [row.shape[0] for row in rows] == [7, 4, 3, 7, 4, 3]
    _check_mixed(served, x, alone, tasks)
    assert served.num_classes("task1.v1") == 7


def test_serving_refuses_a_second_peft_method_on_one_base(tmp_path):
    base, x, folders, _ = _saved_tasks(tmp_path, "vit", ["lora", "ia3"], num_classes=(4, 4))
    served = PeftMultiTask(copy.deepcopy(base))
    served.add_task("a", folders["task0.v1"])
    with pytest.raises(AdapterError, match="ia3"):
        served.add_task("b", folders["task1.v1"])


def test_serving_refuses_an_adapter_that_trains_the_shared_biases(tmp_path):
    base, x, folders, _ = _saved_tasks(tmp_path, "vit", ["lora:bias=lora_only"], num_classes=(4,))
    with pytest.raises(AdapterError, match="bias"):
        PeftMultiTask.from_adapters(copy.deepcopy(base), folders)


def test_serving_refuses_an_adapter_of_another_base(tmp_path):
    base, x, folders, _ = _saved_tasks(tmp_path, "vit", ["lora"])
    torch.manual_seed(1)
    served = PeftMultiTask(tiny_model("vit", num_classes=4))
    with pytest.raises(BaseMismatchError):
        served.add_task("a", folders["task0.v1"])
    served = PeftMultiTask(copy.deepcopy(base))
    served.add_task("a", folders["task0.v1"])
    torch.manual_seed(1)
    other = tiny_model("vit", num_classes=4)
    peft_model, report = apply_peft_policy(other, "lora")
    save_peft_adapter(peft_model, report, tmp_path / "other")
    with pytest.raises(BaseMismatchError):
        served.add_task("b", tmp_path / "other")


def test_a_removed_task_is_no_longer_served(tmp_path):
    base, x, folders, alone = _saved_tasks(tmp_path, "vit", ["lora", "lora"], num_classes=(4, 4))
    served = PeftMultiTask.from_adapters(copy.deepcopy(base), folders)
    served.remove_task("task0.v1")
    assert served.tasks == ["task1.v1"]
    assert (served(x, task="task1.v1") - alone["task1.v1"]).abs().max() <= 1e-5
    memory = served.memory_bytes()
    assert memory["task1.v1"] > 0 and memory["total"] == memory["shared"] + memory["task1.v1"]



def test_tensors_left_out_by_blocks_are_not_reported_as_unwrappable():
    _, everywhere = apply_peft_policy(tiny_model("eva"), "lora")  # q_bias / v_bias: no Linear holds them
    _, one_block = apply_peft_policy(tiny_model("eva"), "lora@0")
    assert everywhere.targets.untargeted == [f"blocks.{b}.attn.{t}_bias" for b in (0, 1) for t in "qv"]
    assert one_block.targets.untargeted == ["blocks.0.attn.q_bias", "blocks.0.attn.v_bias"]
