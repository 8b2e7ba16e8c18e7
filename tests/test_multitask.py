"""Multi-task serving: one backbone, per-task attention, mixed-task batches equal to merged models."""
import copy
import threading

import pytest
import torch

from attnft.methods.record import AdapterRecord
from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.methods.freeze.load import load_adapter
from attnft.core.errors import AdapterError, BaseMismatchError, ConfigError
from attnft.multitask import MultiTaskModel, TaskWeights
from attnft.methods.freeze.policy import apply_policy
from attnft.roles import Role, build_role_map
from attnft.adapters.store import AdapterStore
from tiny_models import TINY_MODELS, tiny_input, tiny_model

FUSED = {"parallel_scaling"}  # attention and FFN in one weight
SERVED_FAMILIES = sorted(set(TINY_MODELS) - FUSED)
TOLERANCE = 1e-5  # fp32


def fine_tune(base, num_classes, seed, policy="attn"):
    """A copy of ``base`` with a new head and its trained tensors moved, as training would: (model, report)."""
    model = copy.deepcopy(base)
    if num_classes is not None:
        model.reset_classifier(num_classes)
    report = apply_policy(model, policy)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in report.trainable:
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return model.eval(), report


def three_tasks(base, policy="attn", classes=(5, 7, 9)):
    """Merged models and TaskWeights of three tasks with their own number of classes."""
    merged, weights = {}, {}
    for seed, num_classes in enumerate(classes):
        name = f"task{seed}"
        model, report = fine_tune(base, num_classes, seed, policy)
        merged[name], weights[name] = model, TaskWeights.from_trained(model, report)
    return merged, weights


def max_mixed_diff(served, merged, x, tasks):
    outputs = served(x, tasks=tasks)
    assert len(outputs) == len(tasks)
    diff = 0.0
    for name, model in merged.items():
        expected = model(x)
        for i in (i for i, t in enumerate(tasks) if t == name):
            assert outputs[i].shape == expected[i].shape
            diff = max(diff, (outputs[i] - expected[i]).abs().max().item())
    return diff


MIXED = ["task0", "task1", "task2", "task1", "task0", "task2", "task2"]


@pytest.mark.parametrize("family", SERVED_FAMILIES)
def test_mixed_batch_equals_each_tasks_merged_model(family):
    base = tiny_model(family).eval()
    merged, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    with torch.no_grad():
        assert max_mixed_diff(served, merged, tiny_input(base, len(MIXED)), MIXED) <= TOLERANCE


@pytest.mark.parametrize("family", ["vit", "swin", "vit_srelpos"])
def test_single_task_batch_equals_its_merged_model(family):
    base = tiny_model(family).eval()
    merged, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    x = tiny_input(base, 3)
    for name, model in merged.items():
        with torch.no_grad():
            assert (served(x, task=name) - model(x)).abs().max() <= TOLERANCE


def test_tasks_differ_only_in_attention_are_still_told_apart():
    base = tiny_model("vit").eval()
    merged, weights = three_tasks(base, policy="attn-head-pos_embed", classes=(None, None, None))
    served = MultiTaskModel.from_adapters(base, weights)
    x = tiny_input(base, len(MIXED))
    with torch.no_grad():
        assert (merged["task0"](x) - merged["task1"](x)).abs().max() > 0.1
        assert max_mixed_diff(served, merged, x, MIXED) <= TOLERANCE


def test_tasks_that_trained_only_some_blocks_share_the_others():
    base = tiny_model("vit").eval()
    merged, weights = three_tasks(base, policy="attn@1")
    served = MultiTaskModel.from_adapters(base, weights)
    with torch.no_grad():
        assert max_mixed_diff(served, merged, tiny_input(base, len(MIXED)), MIXED) <= TOLERANCE


def test_ffn_and_patch_embedding_run_once_over_the_whole_mixed_batch():
    base = tiny_model("vit").eval()
    _, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    calls = []
    hooks = [m.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0])) for m in (base.patch_embed, base.blocks[0].mlp)]
    served(tiny_input(base, len(MIXED)), tasks=MIXED)
    for hook in hooks:
        hook.remove()
    assert calls == [len(MIXED), len(MIXED)]


def test_attention_runs_once_per_task_group_on_its_samples():
    base = tiny_model("vit").eval()
    _, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    rows = []
    hook = base.blocks[0].attn.qkv.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    served(tiny_input(base, len(MIXED)), tasks=MIXED)
    hook.remove()
    assert sorted(rows) == sorted([MIXED.count(name) for name in ("task0", "task1", "task2")])


def test_swin_groups_keep_each_images_windows_together():
    base = tiny_model("swin").eval()
    merged, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    x = tiny_input(base, 4)
    tasks = ["task2", "task0", "task2", "task1"]
    with torch.no_grad():
        assert max_mixed_diff(served, merged, x, tasks) <= TOLERANCE


def test_shared_relative_position_bias_is_per_task_in_mixed_batches():
    base = tiny_model("beit", use_shared_rel_pos_bias=True, use_rel_pos_bias=False).eval()
    merged, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    with torch.no_grad():
        assert max_mixed_diff(served, merged, tiny_input(base, len(MIXED)), MIXED) <= TOLERANCE


def test_switching_tasks_copies_no_weights():
    base = tiny_model("vit").eval()
    merged, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    pointers = {name: p.data_ptr() for name, p in base.named_parameters()}
    memory = served.memory_bytes()["total"]
    x = tiny_input(base, 2)
    for name in ["task1", "task0", "task2", "task0"]:
        served.set_task(name)
        with torch.no_grad():
            assert (served(x) - merged[name](x)).abs().max() <= TOLERANCE
    assert {name: p.data_ptr() for name, p in base.named_parameters()} == pointers
    assert served.memory_bytes()["total"] == memory


def test_base_without_a_task_computes_its_own_outputs():
    base = tiny_model("vit").eval()
    x = tiny_input(base, 2)
    with torch.no_grad():
        before = base(x)
        _, weights = three_tasks(base)
        MultiTaskModel.from_adapters(base, weights)
        assert torch.equal(base(x), before)
    assert set(build_role_map(base).names()) == {name for name, _ in base.named_parameters()}


def test_memory_counts_the_shared_base_once_and_each_task_its_own_tensors():
    base = tiny_model("vit").eval()
    _, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    usage = served.memory_bytes()
    full = sum(p.numel() * p.element_size() for p in base.parameters()) + sum(b.numel() * b.element_size() for b in base.buffers())
    assert usage["shared"] == full
    for name, task in weights.items():
        assert usage[name] == sum(t.numel() * t.element_size() for t in task.tensors.values())
    assert usage["total"] == full + sum(usage[name] for name in weights)


def test_calls_run_in_eval_mode_without_autograd():
    base = tiny_model("vit").train()
    _, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    assert not base.training and not any(p.requires_grad for p in base.parameters())
    out = served(tiny_input(base, 2), task="task0")
    assert not out.requires_grad and out.is_inference()


def test_threads_serving_different_tasks_get_their_own_outputs():
    base = tiny_model("vit").eval()
    merged, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    x = tiny_input(base, 4)
    with torch.no_grad():
        expected = {name: model(x) for name, model in merged.items()}
        expected_mixed = served(x, tasks=["task2", "task0", "task1", "task0"])
    errors = []

    def serve(name):
        for _ in range(20):
            if name == "mixed":
                out = torch.stack([row[:5] for row in served(x, tasks=["task2", "task0", "task1", "task0"])])
                ok = torch.equal(out, torch.stack([row[:5] for row in expected_mixed]))
            else:
                ok = (served(x, task=name) - expected[name]).abs().max() <= TOLERANCE
            if not ok:
                errors.append(name)

    threads = [threading.Thread(target=serve, args=(name,)) for name in ["task0", "task1", "task2", "mixed"]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_removed_task_is_no_longer_served():
    base = tiny_model("vit").eval()
    _, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    served.set_task("task1")
    served.remove_task("task1")
    assert served.tasks == ["task0", "task2"] and served.task is None
    with pytest.raises(ConfigError, match="unknown task 'task1'"):
        served(tiny_input(base, 1), task="task1")


def test_unknown_task_and_wrong_task_count_are_config_errors():
    base = tiny_model("vit").eval()
    _, weights = three_tasks(base)
    served = MultiTaskModel.from_adapters(base, weights)
    x = tiny_input(base, 2)
    with pytest.raises(ConfigError, match="served tasks are task0, task1, task2"):
        served(x, tasks=["task0", "cars"])
    with pytest.raises(ConfigError, match="one task name per sample"):
        served(x, tasks=["task0"])
    with pytest.raises(ConfigError, match="name a task"):
        served(x)
    with pytest.raises(ConfigError, match="already served"):
        served.add_task("task0", weights["task0"])


def test_adapter_training_ffn_weights_is_refused():
    base = tiny_model("vit").eval()
    model, report = fine_tune(base, 5, 0, policy="attn+mlp")
    served = MultiTaskModel(base)
    with pytest.raises(AdapterError, match="ffn weight"):
        served.add_task("ffn", TaskWeights.from_trained(model, report))


def test_fused_attention_and_ffn_family_is_refused():
    with pytest.raises(ConfigError, match="ParallelScalingBlock"):
        MultiTaskModel(tiny_model("parallel_scaling"))


def save_three_adapters(store, base, mode):
    """Fine-tune three tasks from ``base`` and save them in ``store`` as adapters."""
    for seed, num_classes in enumerate((5, 7, 9)):
        model = copy.deepcopy(base)
        model.reset_classifier(num_classes)
        report = apply_policy(model, "attn")
        snapshot = BaseSnapshot.capture(model, report)
        model, _ = fine_tune(model, None, seed)
        store.save(f"task{seed}", model, report, snapshot, AdapterRecord.of(model, label_names=[f"c{i}" for i in range(num_classes)]),
                   mode=mode)


@pytest.mark.parametrize("family,mode", [("vit", "exact"), ("swin", "delta"), ("xcit", "exact")])
def test_store_adapters_mixed_batch_equals_load_adapter_merged_models(tmp_path, family, mode):
    base = tiny_model(family).eval()
    store = AdapterStore(tmp_path)
    save_three_adapters(store, base, mode)
    merged = {}
    for name in store.names():
        merged[name] = copy.deepcopy(base)
        load_adapter(merged[name], store.read(name))
        merged[name].eval()
    served = MultiTaskModel.from_store(store, ["task0", "task1", "task2"], base_model=base)
    assert served.num_classes("task1") == 7 and served.label_names("task1")[-1] == "c6"
    with torch.no_grad():
        assert max_mixed_diff(served, merged, tiny_input(base, len(MIXED)), MIXED) <= TOLERANCE


def test_adapter_of_another_base_is_refused(tmp_path):
    store = AdapterStore(tmp_path)
    save_three_adapters(store, tiny_model("vit").eval(), "exact")
    torch.manual_seed(1)
    other_base = tiny_model("vit").eval()
    served = MultiTaskModel(other_base)
    with pytest.raises(BaseMismatchError, match="share one base"):
        served.add_task("task0", store.read("task0"))


def test_every_slot_belongs_to_a_served_role():
    base = tiny_model("vit_attn_pool")
    role_map = build_role_map(base)
    served = MultiTaskModel(base)
    for name in role_map.names():
        role = role_map.of(name)[0].role
        assert (name in served.slots.by_param) == (role in {Role.ATTENTION, Role.HEAD, Role.POS_EMBED, Role.TOKENS})


def test_a_batch_at_another_size_or_empty_is_an_attnft_error_not_a_bare_assertion():
    import pytest as _pytest

    from attnft.core.errors import ConfigError
    from attnft.multitask import MultiTaskModel

    base = tiny_model("vit")
    mt = MultiTaskModel(base)
    size = base.patch_embed.img_size[0]
    with _pytest.raises(ConfigError, match=f"the base is built for {size}x{size}"):
        mt(torch.randn(2, 3, size * 2, size * 2))
    with _pytest.raises(ConfigError, match=r"a batch is a tensor \[B >= 1"):
        mt(torch.randn(0, 3, size, size), tasks=[])
