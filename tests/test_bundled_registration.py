"""The bundled ViTs are known to timm wherever attnft is imported, and importing attnft stays cheap."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

from attnft import bundled
from attnft.data import fashion_mnist
from snippets import clean_env

REPO = Path(__file__).resolve().parents[1]


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` (or ``-m attnft args``) in a fresh interpreter that finds this checkout's attnft."""
    argv = [sys.executable, "-m", "attnft", *args] if args else [sys.executable, "-c", code]
    return subprocess.run(argv, env=clean_env({"PYTHONPATH": str(REPO)}), capture_output=True, text=True, timeout=600)


def test_import_attnft_registers_the_bundled_model_once_timm_loads_without_importing_timm_or_torch():
    out = run_python(
        "import sys, attnft\n"
        "assert 'timm' not in sys.modules and 'torch' not in sys.modules, 'import attnft imported timm or torch'\n"
        "import timm\n"
        "assert 'datasets' not in sys.modules, 'registering imported datasets'\n"
        f"print(*(timm.is_model(name) for name in {list(bundled.BUNDLED_MODELS)!r}))\n"
    )
    assert out.returncode == 0 and out.stdout.split() == ["True"] * len(bundled.BUNDLED_MODELS), out.stderr


def test_import_attnft_after_timm_registers_the_bundled_model_at_once():
    out = run_python(f"import timm, attnft; print(timm.create_model({bundled.BUNDLED_MODEL_28!r}, pretrained=True).num_classes)")
    assert out.returncode == 0 and out.stdout.split() == ["10"], out.stderr


@pytest.mark.parametrize("name", bundled.BUNDLED_MODELS)
def test_policies_of_a_bundled_model_through_the_cli(name):
    out = run_python("", "policies", name, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    roles = {role["role"]: role for role in report["roles"]}
    assert report["total"] == bundled.bundled_facts(name)["parameters"]
    assert roles["attention"]["trainable"] == roles["attention"]["total"] > 0 and roles["ffn"]["trainable"] == 0


def test_the_bundled_models_data_facts_are_the_fashion_mnist_readers():
    assert (bundled.LABEL_NAMES, bundled.MEAN, bundled.STD) == (fashion_mnist.LABEL_NAMES, fashion_mnist.MEAN, fashion_mnist.STD)


def test_every_bundled_model_has_a_timm_equivalent_and_shipped_weights():
    assert set(bundled.TIMM_EQUIVALENTS) == set(bundled.BUNDLED_MODELS)
    assert all(timm.models.get_pretrained_cfg(name).file == bundled.weights_path(name) for name in bundled.BUNDLED_MODELS)


@pytest.mark.parametrize("bundled_name", bundled.BUNDLED_MODELS)
def test_its_timm_equivalent_is_the_same_model_under_a_name_plain_timm_registers(bundled_name):
    name, args = bundled.TIMM_EQUIVALENTS[bundled_name]
    assert timm.models.model_entrypoint(name).__module__.startswith("timm.")
    ours = timm.create_model(bundled_name, pretrained=True).eval()
    weights = bundled.weights_path(bundled_name)
    theirs = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=weights, num_classes=10),
                               num_classes=10, **args).eval()
    size = args["img_size"]
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))


def test_the_default_model_is_a_bundled_one_so_the_demo_runs_offline():
    from attnft.training.config import DEFAULT_MODEL

    assert DEFAULT_MODEL in bundled.BUNDLED_MODELS
