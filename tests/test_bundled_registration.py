"""The bundled ViT is known to timm wherever attnft is imported, and importing attnft stays cheap."""
import json
import subprocess
import sys
from pathlib import Path

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
        f"print(timm.is_model({bundled.BUNDLED_MODEL!r}))\n"
    )
    assert out.returncode == 0 and out.stdout.split() == ["True"], out.stderr


def test_import_attnft_after_timm_registers_the_bundled_model_at_once():
    out = run_python(f"import timm, attnft; print(timm.create_model({bundled.BUNDLED_MODEL!r}, pretrained=True).num_classes)")
    assert out.returncode == 0 and out.stdout.split() == ["10"], out.stderr


def test_policies_of_the_bundled_model_through_the_cli():
    out = run_python("", "policies", bundled.BUNDLED_MODEL, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["total"] == bundled.bundled_facts()["parameters"] and 0.3 < report["trainable_share"] < 0.4


def test_the_bundled_models_data_facts_are_the_fashion_mnist_readers():
    assert (bundled.LABEL_NAMES, bundled.MEAN, bundled.STD) == (fashion_mnist.LABEL_NAMES, fashion_mnist.MEAN, fashion_mnist.STD)


def test_its_timm_equivalent_is_the_same_model_under_a_name_plain_timm_registers():
    name, args = bundled.TIMM_EQUIVALENTS[bundled.BUNDLED_MODEL]
    assert timm.models.model_entrypoint(name).__module__.startswith("timm.")
    ours = timm.create_model(bundled.BUNDLED_MODEL, pretrained=True).eval()
    theirs = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=bundled.WEIGHTS_PATH, num_classes=10),
                               num_classes=10, **args).eval()
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
