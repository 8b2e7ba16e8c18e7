"""AdaptFormer's layers (attnft/methods/adaptformer/layers.py): a scaled ReLU bottleneck beside each block's FFN on
the FFN's normalised input, added outside its layer scale and drop path, stacked per task."""
import copy

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from tiny_models import tiny_input, tiny_model

from attnft.core.errors import ConfigError
from attnft.methods.adaptformer import layers as adaptformer
from attnft.methods.rows import task_rows


def tiny_vit(**kwargs):
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5,
                             **kwargs).eval()


def randomize(model, names, std=0.5):
    """As if trained: the zero-initialised up projections too."""
    with torch.no_grad():
        for name in names:
            model.get_parameter(name).normal_(std=std)


def test_vit_base_count_is_down_and_up_with_biases_per_block():
    model = timm.create_model("vit_base_patch16_224", pretrained=False)
    names = adaptformer.add(model, adaptformer.Options(dim=64))
    assert sum(model.get_parameter(name).numel() for name in names) == 12 * (768 * 64 + 64 + 64 * 768 + 768)
    assert sum(model.get_parameter(name).numel() for name in names) == 1_189_632


def test_every_added_name_has_the_prefix_and_a_task_row():
    model = tiny_vit()
    before = set(model.state_dict())
    names = adaptformer.add(model, adaptformer.Options(dim=4), tasks=3)
    assert set(model.state_dict()) - before == set(names) and before < set(model.state_dict())
    assert all(any(part.startswith(adaptformer.PREFIX) for part in name.split(".")) for name in names)
    shapes = {name.rsplit(".", 1)[1]: tuple(model.get_parameter(name).shape) for name in names}
    assert shapes == {"down_weight": (3, 32, 4), "down_bias": (3, 4), "up_weight": (3, 4, 32), "up_bias": (3, 32)}
    assert len(names) == 2 * 4 and names[0] == "blocks.0.adaptformer_adapter.down_weight"
    assert all(model.get_parameter(name).requires_grad for name in names)


def test_the_authors_init_down_as_a_linear_up_zero():
    model = tiny_vit()
    adaptformer.add(model, adaptformer.Options(dim=16))
    adapter = model.blocks[0].adaptformer_adapter
    bound = 1 / 32 ** 0.5  # kaiming_uniform(a=sqrt(5)) on fan-in D, as nn.Linear
    assert adapter.down_weight.abs().max() <= bound and adapter.down_weight.abs().max() > bound / 2
    assert not adapter.down_bias.any() and not adapter.up_weight.any() and not adapter.up_bias.any()


@pytest.mark.parametrize("family", ["vit", "deit3", "deit_distilled", "vit_qknorm_reg", "parallel",
                                    "parallel_scaling"])
def test_a_fresh_adapter_leaves_the_logits_exactly_the_bases(family):
    model = tiny_model(family).eval()
    x = tiny_input(model)
    plain = model(x)
    adaptformer.add(model)
    assert torch.equal(model(x), plain)


def test_remove_restores_the_plain_model():
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    keys, plain = list(model.state_dict()), model(x)
    randomize(model, adaptformer.add(model))
    assert not torch.allclose(model(x), plain, atol=1e-3)
    adaptformer.remove(model)
    assert list(model.state_dict()) == keys and torch.equal(model(x), plain)
    assert not any(hasattr(module, "adaptformer_hooks") for module in model.modules())


def test_add_twice_a_bad_width_and_a_bad_task_count_are_refused():
    model = tiny_vit()
    with pytest.raises(ConfigError, match="dim"):
        adaptformer.Options(dim=0)
    with pytest.raises(ConfigError, match="tasks"):
        adaptformer.add(model, tasks=0)
    adaptformer.add(model)
    with pytest.raises(ConfigError, match="already"):
        adaptformer.add(model)


def test_deit3_the_bottleneck_reads_norm2_and_is_added_outside_the_layer_scale():
    model = tiny_vit(init_values=1e-5, no_embed_class=True)  # DeiT III: layer scale ls1 / ls2
    plain = copy.deepcopy(model)
    options = adaptformer.Options(dim=8, scale=0.3)
    randomize(model, adaptformer.add(model, options))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = plain.norm_pre(plain.patch_drop(plain._pos_embed(plain.patch_embed(x))))
        for block, adapted in zip(plain.blocks, model.blocks):
            tokens = tokens + block.ls1(block.attn(block.norm1(tokens)))
            h = block.norm2(tokens)
            w = adapted.adaptformer_adapter
            bottleneck = (F.relu(h @ w.down_weight[0] + w.down_bias[0]) @ w.up_weight[0] + w.up_bias[0]) * 0.3
            tokens = tokens + block.ls2(block.mlp(h)) + bottleneck
        assert torch.allclose(model.forward_features(x), plain.norm(tokens), atol=1e-5)


def test_the_bottleneck_is_added_outside_the_drop_path():
    model = tiny_vit(drop_path_rate=1.0).train()  # block 1 drops both of its branches in training
    randomize(model, adaptformer.add(model))
    block, x = model.blocks[1], torch.randn(2, 5, 32)
    with torch.no_grad():
        expected = x + block.adaptformer_adapter(F.layer_norm(x, (32,), block.norm2.weight, block.norm2.bias, 1e-6))
        assert torch.allclose(block(x), expected, atol=1e-6)


@pytest.mark.parametrize("family", ["parallel", "parallel_scaling"])
def test_parallel_blocks_take_a_bottleneck_per_ffn_on_its_norm(family):
    model = tiny_model(family).eval()
    plain = copy.deepcopy(model)
    randomize(model, adaptformer.add(model))
    block, reference, x = model.blocks[0], plain.blocks[0], torch.randn(2, 5, 32)
    with torch.no_grad():
        if family == "parallel":  # ParallelThingsBlock: N attentions, then N FFNs, each with its own bottleneck
            assert len(block.adaptformer_adapters) == len(block.ffns) == 2
            mid = x + sum(attn(x) for attn in reference.attns)
            expected = mid + sum(ffn(mid) + adapter(ffn.norm(mid))
                                 for ffn, adapter in zip(reference.ffns, block.adaptformer_adapters))
        else:  # ParallelScalingBlock: one fused FFN on in_norm
            expected = reference(x) + block.adaptformer_adapter(reference.in_norm(x))
        assert torch.allclose(block(x), expected, atol=1e-5)


@pytest.mark.parametrize("family", ["vit", "deit3", "parallel", "parallel_scaling"])
def test_a_mixed_batch_of_two_tasks_equals_each_single_task_model_on_its_samples(family):
    base = tiny_model(family).eval()
    options = adaptformer.Options(dim=8)
    singles = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        single = copy.deepcopy(base)
        randomize(single, adaptformer.add(single, options))
        singles.append(single)
    served = copy.deepcopy(base)
    names = adaptformer.add(served, options, tasks=3)
    x = tiny_input(base, batch=4)
    with torch.no_grad():
        assert torch.equal(served(x), base(x))  # row 0, the identity: the base
        for row, single in enumerate(singles, 1):
            for name in names:
                served.get_parameter(name)[row] = single.get_parameter(name)[0]
        with task_rows({adaptformer.FAMILY: torch.tensor([1, 2, 1, 2])}):
            mixed = served(x)
        with task_rows({adaptformer.FAMILY: torch.tensor([0, 1, 0, 0])}):
            with_identity = served(x)
        assert torch.allclose(mixed[0::2], singles[0](x[0::2]), atol=1e-5)
        assert torch.allclose(mixed[1::2], singles[1](x[1::2]), atol=1e-5)
        assert torch.allclose(with_identity[[0, 2, 3]], base(x[[0, 2, 3]]), atol=1e-5)
        assert torch.allclose(with_identity[1], singles[0](x[1:2])[0], atol=1e-5)


def test_training_steps_reach_the_bottlenecks_and_nothing_else():
    model = tiny_vit()
    for p in model.parameters():
        p.requires_grad_(False)
    names = adaptformer.add(model, adaptformer.Options(dim=4))
    before = {name: model.get_parameter(name).clone() for name in names}
    optimizer = torch.optim.SGD([model.get_parameter(name) for name in names], lr=0.5)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    for _ in range(2):  # up starts at zero, so down's gradient is zero until up has moved
        optimizer.zero_grad()
        F.cross_entropy(model.train()(x), y).backward()
        optimizer.step()
    assert all(not torch.equal(model.get_parameter(name), before[name]) for name in names)
    assert all(p.grad is None for name, p in model.named_parameters() if name not in before)


def test_gradient_checkpointing_gives_the_same_gradients():
    model = tiny_vit()
    names = adaptformer.add(model, adaptformer.Options(dim=4))
    randomize(model, names)
    checkpointed = copy.deepcopy(model)
    checkpointed.set_grad_checkpointing(True)
    x = torch.randn(2, 3, 32, 32)
    for m in (model, checkpointed):
        m.train()(x).square().sum().backward()
    for name in names:
        assert torch.allclose(checkpointed.get_parameter(name).grad, model.get_parameter(name).grad, atol=1e-5)


def test_check_model_refuses_a_swin_and_blocks_without_a_pre_norm_ffn():
    with pytest.raises(ConfigError, match="VisionTransformer family") as refused:
        adaptformer.check_model(tiny_model("swin"))
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="ResPostBlock"):
        adaptformer.add(tiny_model("vit_respost"))


def test_threads_sharing_one_model_each_get_their_own_bottleneck_outputs():
    from concurrent.futures import ThreadPoolExecutor

    model = tiny_vit()
    randomize(model, adaptformer.add(model))
    inputs = [torch.randn(1 + i % 3, 3, 32, 32) for i in range(12)]
    with torch.no_grad():
        alone = [model(x) for x in inputs]
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(model, inputs))
    assert all(torch.equal(a, b) for a, b in zip(alone, together))


def tiny_transformers(distilled=False):
    import transformers

    kwargs = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 64, "num_labels": 5}
    if distilled:
        return transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**kwargs)).eval()
    return transformers.ViTForImageClassification(transformers.ViTConfig(**kwargs)).eval()


@pytest.mark.parametrize("distilled", [False, True], ids=["vit", "deit-distilled"])
def test_transformers_layers_take_the_bottleneck_on_layernorm_after_beside_the_mlp(distilled):
    model = tiny_transformers(distilled)
    plain = copy.deepcopy(model)
    x = torch.randn(2, 3, 32, 32)
    keys, logits = list(model.state_dict()), model(x).logits
    names = adaptformer.add(model, adaptformer.Options(dim=4))
    assert torch.equal(model(x).logits, logits)  # up is zero
    assert all(any(part.startswith(adaptformer.PREFIX) for part in name.split(".")) for name in names)
    randomize(model, names)
    layer = (model.deit if distilled else model.vit).layers[0]
    reference, tokens = (plain.deit if distilled else plain.vit).layers[0], torch.randn(2, 7, 32)
    with torch.no_grad():
        mid = tokens + reference.attention(reference.layernorm_before(tokens))[0]
        expected = reference(tokens) + layer.adaptformer_adapter(reference.layernorm_after(mid))
        assert torch.allclose(layer(tokens), expected, atol=1e-5)
    adaptformer.remove(model)
    assert list(model.state_dict()) == keys and torch.equal(model(x).logits, logits)


def test_a_deep_copy_adapts_with_its_own_tensors_and_removes_its_own_hooks():
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    names = adaptformer.add(model)
    randomize(model, names)
    with torch.no_grad():
        before, twin = model(x), copy.deepcopy(model)
        randomize(twin, names)
        assert not torch.allclose(twin(x), before) and torch.equal(model(x), before)
        adaptformer.remove(twin)
        assert torch.equal(model(x), before)
