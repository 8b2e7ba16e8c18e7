"""The Python API says what is wrong with an argument: a TypeError naming it (as timm and peft do), or an attnft
error in one line for a batch a served model cannot take; never an AttributeError from deep inside."""
import pytest
import torch

import subprocess
import sys

from attnft import AdapterStore, CompareConfig, FinetuneConfig, MultiTaskModel, apply_policy, create_model, finetune
from attnft.compare import compare  # its home: in this process attnft.compare may be the package already
from attnft.core.errors import AdapterError, ConfigError


@pytest.mark.parametrize("call, words", [
    (lambda: create_model(123), "name must be a model name"),
    (lambda: apply_policy(None, "attn"), "model must be a torch.nn.Module"),
    (lambda: AdapterStore(123), "root must be a folder"),
    (lambda: MultiTaskModel(None), "base_model must be a torch.nn.Module"),
    (lambda: finetune(None), "cfg must be a FinetuneConfig"),
    (lambda: compare(CompareConfig(), None), "ft must be a FinetuneConfig"),
    (lambda: compare(None, FinetuneConfig()), "cfg must be a CompareConfig"),
])
def test_a_wrong_argument_is_a_type_error_naming_it(call, words):
    with pytest.raises(TypeError, match=words):
        call()


@pytest.fixture(scope="module")
def served():
    model = MultiTaskModel(create_model("vit_fmnist_patch4_28", pretrained=True))
    model.add_task("t", {})
    return model


@pytest.mark.parametrize("batch, words", [
    (torch.rand(2, 1, 28, 28), "the base takes 3"),
    (torch.rand(2, 3, 28, 28, dtype=torch.float64), "the batch is torch.float64"),
    (torch.zeros(2, 3, 28, 28, dtype=torch.uint8), "the batch is torch.uint8"),
])
def test_a_batch_of_other_channels_or_dtype_is_one_line(served, batch, words):
    with pytest.raises(ConfigError, match=words) as error:
        served(batch, task="t")
    assert "\n" not in str(error.value)


def test_a_task_of_non_finite_tensors_is_refused_and_nothing_is_added(served):
    head = dict(served.base.head.named_parameters())
    with pytest.raises(AdapterError, match="not a tensor of finite values"):
        served.add_task("nan", {"head.weight": torch.full_like(head["weight"], float("nan"))})
    assert served.tasks == ["t"]


def test_from_store_takes_a_list_of_names_not_one_string(tmp_path):
    with pytest.raises(TypeError, match="names is a list of adapter names"):
        MultiTaskModel.from_store(AdapterStore(tmp_path), "cars", base_model=create_model("vit_fmnist_patch4_28"))


def test_the_public_compare_runs_a_comparison_whatever_was_imported_first():
    """``attnft.compare`` is a package and a function: ``from attnft import compare`` gives whichever the import
    order left there, and either, called, is the function (here it refuses a wrong argument by name)."""
    code = ("import attnft.compare.study as search\nfrom attnft import CompareConfig, compare\nimport attnft\n"
            "for run in (compare, attnft.compare):\n"
            "    try:\n        run(CompareConfig(), None)\n    except TypeError as e:\n"
            "        assert 'ft must be a FinetuneConfig' in str(e), e\n    else:\n        raise AssertionError(run)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
