"""--layer-decay: timm's layer-wise groups over what trains, for every policy and both libraries, and the
schedule that applies each group's lr_scale."""
import pytest
import torch
from safetensors.torch import load_file
from timm.optim import param_groups_layer_decay

from attnft.cli import main
from attnft.methods import parse_method
from attnft.training.schedule import warmup_cosine_schedule
from test_runner import finetune_args, one_thread_and_private_caches, tiny  # noqa: F401
from tiny_models import tiny_model

DECAY = 0.75


def named_groups(groups, model) -> list[tuple]:
    """Each group as (lr_scale, weight_decay, its tensors' names), in order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [(g["lr_scale"], g["weight_decay"], [names[id(p)] for p in g["params"]]) for g in groups]


def scale_of(groups, model) -> dict[str, float]:
    return {name: scale for scale, _, names in named_groups(groups, model) for name in names}


def applied(model, policy):
    result = parse_method(policy).apply(model)
    result.report.remove_hooks()
    return result


@pytest.mark.parametrize("family", ["vit", "deit_distilled", "swin", "eva", "parallel_scaling"])
def test_under_full_the_groups_are_timms_own_for_a_timm_model(family):
    model = tiny_model(family)
    expected = param_groups_layer_decay(model, weight_decay=0.05, layer_decay=DECAY,
                                        no_weight_decay_list=model.no_weight_decay())
    groups = applied(model, "full").optimizer_params(0.05, DECAY)
    assert named_groups(groups, model) == named_groups(expected, model)


def test_under_attn_only_the_trainable_tensors_are_grouped_with_the_scales_they_have_under_full():
    full = scale_of(applied(base := tiny_model("vit"), "full").optimizer_params(0.05, DECAY), base)
    model = tiny_model("vit")
    groups = applied(model, "attn").optimizer_params(0.05, DECAY)
    scales = scale_of(groups, model)
    assert set(scales) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert scales == {name: full[name] for name in scales}
    assert scales["blocks.0.attn.qkv.weight"] == DECAY ** 2 and scales["head.weight"] == 1.0  # 2 blocks: 4 layers
    assert scales["pos_embed"] == DECAY ** 3
    decays = {n: wd for _, wd, names in named_groups(groups, model) for n in names}
    assert decays["pos_embed"] == decays["blocks.0.attn.qkv.bias"] == 0.0 and decays["head.weight"] == 0.05


@pytest.mark.parametrize("policy", ["lora", "ia3"])
def test_a_peft_tensor_trains_at_the_scale_of_the_block_it_sits_in_and_the_head_copy_on_top(policy):
    full = scale_of(applied(model := tiny_model("vit"), "full").optimizer_params(0.05, DECAY), model)
    peft = applied(tiny_model("vit"), policy)
    groups = peft.optimizer_params(0.05, DECAY)
    scales = scale_of(groups, peft.model)
    assert set(scales) == {n for n, p in peft.model.named_parameters() if p.requires_grad}
    for name, scale in scales.items():  # base_model.model.blocks.1.attn.qkv.lora_A.default.weight
        block = next((b for b in ("blocks.0.", "blocks.1.") if f".{b}" in name), None)
        assert scale == (full[block + "attn.qkv.weight"] if block else 1.0), name
    if policy == "ia3":  # its scales start at 1: never decayed, as without layer decay
        assert all(wd == 0.0 for _, wd, names in named_groups(groups, peft.model) for n in names if "ia3_l" in n)


def tiny_transformers_vit():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8, num_labels=3)
    return transformers.ViTForImageClassification(config)


def test_a_transformers_model_takes_its_layers_from_the_role_map():
    from attnft.roles import build_role_map

    model = tiny_transformers_vit()
    blocks = [dict(model.named_modules())[path] for path in build_role_map(model).block_paths()]
    scales = scale_of(applied(model, "full").optimizer_params(0.05, DECAY), model)
    expected = {id(p): DECAY ** 3 for p in model.vit.embeddings.parameters()}  # patch + position embeddings, token
    expected |= {id(p): DECAY ** (2 - i) for i, block in enumerate(blocks) for p in block.parameters()}
    expected |= {id(p): DECAY for p in model.vit.layernorm.parameters()}  # the final norm: with the last block
    expected |= {id(p): 1.0 for p in model.classifier.parameters()}
    assert len(expected) == len(scales)
    assert scales == {name: expected[id(p)] for name, p in model.named_parameters()}


def test_a_lora_tensor_of_a_transformers_model_trains_at_its_blocks_scale():
    from attnft.roles import build_role_map

    peft = applied(tiny_transformers_vit(), "lora")
    paths = build_role_map(peft.backbone).block_paths()  # peft's injected modules sit inside them
    scales = scale_of(peft.optimizer_params(0.05, DECAY), peft.model)
    assert scales and set(scales) == {n for n, p in peft.model.named_parameters() if p.requires_grad}
    for name, scale in scales.items():
        block = next((i for i, path in enumerate(paths) if f".{path}." in name), None)
        assert scale == (DECAY ** (2 - block) if block is not None else 1.0), name


def test_the_schedule_scales_each_groups_whole_curve_by_its_lr_scale():
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(3)]
    optimizer = torch.optim.SGD([{"params": [params[0]]}, {"params": [params[1]], "lr_scale": 0.5},
                                 {"params": [params[2]], "lr_scale": 0.25}], lr=1.0)
    schedule = warmup_cosine_schedule(optimizer, warmup_steps=2, total_steps=6, min_ratio=0.1)
    for _ in range(6):
        top, half, quarter = (group["lr"] for group in optimizer.param_groups)
        assert (half, quarter) == (0.5 * top, 0.25 * top)
        optimizer.step()
        schedule.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1) and optimizer.param_groups[2]["lr"] == 0.025


# ---- in a run ---------------------------------------------------------------------------------

def test_in_a_run_each_group_follows_the_schedule_at_its_scale_and_the_log_shows_the_top_lr(tiny, tmp_path,
                                                                                            monkeypatch, capsys):
    import timm.optim

    from attnft.training.run_folder import MetricsLog

    captured = {}
    real = timm.optim.create_optimizer_v2

    def spy(params, **kwargs):
        captured["optimizer"] = real(params, **kwargs)
        return captured["optimizer"]

    monkeypatch.setattr(timm.optim, "create_optimizer_v2", spy)
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "4", "--policy", "full", "--layer-decay", "0.5",
                              "--min-lr", "1e-4", "--log-every", "1", "--no-eval-before")) == 0
    assert "layer decay 0.5: 4 trained layer(s), lr x 0.125 (lowest) to x 1 (highest)" in capsys.readouterr().out
    groups = captured["optimizer"].param_groups
    assert sorted({g["lr_scale"] for g in groups}) == [0.125, 0.25, 0.5, 1.0]
    assert all(g["lr"] == pytest.approx(g["lr_scale"] * 1e-4) for g in groups)  # the cosine's end, scaled
    logged = [r["lr"] for r in MetricsLog(tmp_path / "run" / "metrics.jsonl").read() if "lr" in r]
    assert logged[-1] == pytest.approx(1e-4)


@pytest.mark.parametrize("policy", ["full", "lora"])
def test_layer_decay_1_trains_bitwise_as_a_run_without_it(tiny, tmp_path, policy):
    """Every scale 1: the groups change, no tensor's arithmetic does (weight decay, lr, schedule)."""
    model, data = tiny
    common = ["--steps", "6", "--policy", policy, "--warmup-epochs", "0.5", "--mixup", "0.8", "--no-eval-before",
              "--name", "run"]
    for run, extra in (("off", []), ("one", ["--layer-decay", "1"])):
        torch.manual_seed(0)  # peft draws LoRA's start from the global generator, as a fresh process has it
        assert main(finetune_args(model, data, tmp_path / run, *common, *extra)) == 0
    off, one = (load_file(str(tmp_path / r / "store" / "run" / "adapter_model.safetensors")) for r in ("off", "one"))
    assert off.keys() == one.keys() and all(torch.equal(off[name], one[name]) for name in off)
