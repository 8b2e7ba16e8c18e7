"""Speed settings: what each helper returns on this machine (a CPU), and on a GPU as far as a
CPU can tell."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from attnft.training import speed
from attnft.tuning.memory import enable_ffn_recompute
from attnft.methods.freeze.policy import apply_policy
from attnft.training.speed import (
    adamw_kwargs,
    default_workers,
    enable_tf32,
    fused_adamw_supported,
    loader_kwargs,
    maybe_compile,
)
from tiny_models import tiny_input, tiny_model


@pytest.fixture
def tf32_flags():
    """Restore the process-wide TF32 flags after a test."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _flags():
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def _pretend_gpu(monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


# --- TF32 -----------------------------------------------------------------------------------


def test_enable_tf32_changes_nothing_on_the_cpu(tf32_flags):
    torch.backends.cuda.matmul.allow_tf32 = False
    before = _flags()
    assert enable_tf32("cpu") is False
    assert enable_tf32(torch.device("cpu")) is False
    assert _flags() == before


def test_enable_tf32_sets_both_flags_on_an_ampere_or_newer_gpu(tf32_flags, monkeypatch):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    _pretend_gpu(monkeypatch, (9, 0))  # H100 / H200
    assert enable_tf32("cuda") is True
    assert _flags() == (True, True)
    assert torch.get_float32_matmul_precision() == "high"


def test_enable_tf32_leaves_gpus_without_tf32_alone(tf32_flags, monkeypatch):
    torch.backends.cuda.matmul.allow_tf32 = False
    before = _flags()
    _pretend_gpu(monkeypatch, (7, 0))  # V100: no TF32
    assert enable_tf32("cuda:0") is False
    assert _flags() == before


# --- fused AdamW ----------------------------------------------------------------------------


def test_adamw_kwargs_ask_for_the_fused_kernel_where_torch_has_one():
    assert adamw_kwargs("cpu") == ({"fused": True} if fused_adamw_supported("cpu") else {})
    assert adamw_kwargs("meta") == {}  # no fused kernel for it


def test_fused_adamw_supported_falls_back_to_cuda_only_on_old_torch(monkeypatch):
    import torch.utils._foreach_utils as foreach_utils

    monkeypatch.delattr(foreach_utils, "_get_fused_kernels_supported_devices")
    assert fused_adamw_supported("cuda") is True
    assert fused_adamw_supported("cpu") is False


def test_adamw_with_adamw_kwargs_takes_the_same_step_up_to_rounding():
    torch.manual_seed(0)
    start = [torch.randn(64, 32), torch.randn(32)]
    grads = [torch.randn_like(t) for t in start]
    results = []
    for extra in ({}, adamw_kwargs("cpu")):
        params = [t.clone().requires_grad_() for t in start]
        optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05, **extra)
        for _ in range(3):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            optimizer.step()
        results.append(params)
    for default, fast in zip(*results):
        torch.testing.assert_close(fast, default, rtol=0, atol=1e-6)


# --- data-loader workers --------------------------------------------------------------------


@pytest.mark.parametrize(
    "cores, processes, workers",
    [(2, 1, 1), (1, 1, 0), (4, 1, 3), (16, 1, 8), (64, 1, 8), (16, 8, 1), (8, 8, 0), (2, 4, 0)],
)
def test_default_workers_leave_a_core_per_training_process_and_stop_at_eight(cores, processes, workers):
    assert default_workers(processes, cores=cores) == workers


def test_default_workers_count_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr(speed, "available_cores", lambda: 6)
    assert default_workers() == 5
    assert default_workers(processes=2) == 2


def test_default_workers_refuse_zero_processes():
    with pytest.raises(ValueError, match="processes"):
        default_workers(0, cores=4)


def test_loader_kwargs_without_workers_are_what_a_plain_loader_takes():
    kwargs = loader_kwargs(0, "cpu")
    assert kwargs == {"num_workers": 0, "pin_memory": False}
    assert len(list(DataLoader(TensorDataset(torch.arange(4)), batch_size=2, **kwargs))) == 2


def test_loader_kwargs_pin_memory_for_a_gpu_and_keep_workers_alive():
    assert loader_kwargs(4, "cuda") == {"num_workers": 4, "pin_memory": True, "persistent_workers": True,
                                        "prefetch_factor": 2}
    assert loader_kwargs(4, torch.device("cuda", 1), persistent=False, prefetch_factor=4)["persistent_workers"] is False


def test_loader_kwargs_with_a_worker_make_a_working_loader():
    loader = DataLoader(TensorDataset(torch.arange(6)), batch_size=2, **loader_kwargs(1, "cpu"))
    for _ in range(2):  # the persistent worker serves the second epoch too
        assert torch.cat([batch for (batch,) in loader]).tolist() == list(range(6))


def test_loader_kwargs_refuse_negative_workers():
    with pytest.raises(ValueError, match="workers"):
        loader_kwargs(-1, "cpu")


# --- torch.compile --------------------------------------------------------------------------


def _step(model):
    torch.manual_seed(1)
    out = model(tiny_input(model))
    out.square().mean().backward()
    return out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _attn_vit(recompute=False):
    torch.manual_seed(0)
    model = tiny_model("vit")
    apply_policy(model, "attn")
    if recompute:
        enable_ffn_recompute(model)
    return model


def test_maybe_compile_disabled_returns_the_model_untouched():
    model = _attn_vit()
    assert maybe_compile(model, False) is model
    assert model._compiled_call_impl is None


def test_maybe_compile_compiles_in_place_keeping_every_name():
    model = _attn_vit()
    keys = list(model.state_dict())
    compiled = maybe_compile(model, backend="eager")  # dynamo tracing only: seconds, no C++ compiler
    assert compiled is model and model._compiled_call_impl is not None
    assert list(model.state_dict()) == keys


@pytest.mark.parametrize("recompute", [False, True], ids=["plain", "ffn_recompute"])
def test_a_compiled_model_gives_the_same_outputs_and_grads(recompute):
    eager_out, eager_grads = _step(_attn_vit(recompute))
    out, grads = _step(maybe_compile(_attn_vit(recompute), backend="eager"))
    torch.testing.assert_close(out, eager_out, rtol=0, atol=1e-6)
    assert grads.keys() == eager_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], eager_grads[name], rtol=0, atol=1e-6, msg=name)
