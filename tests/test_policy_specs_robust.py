"""Policy specs that used to build huge sets, train nothing or be read silently wrong are refused
in one line (issue: robustness, round two)."""
import time

import pytest

from attnft.cli import main
from attnft.core.errors import AttnftError, UnknownPolicyError
from attnft.methods import parse_method
from attnft.methods.freeze.policy import Policy, apply_policy
from tiny_models import tiny_model


@pytest.mark.parametrize("spec, words", [
    ("attn@0-99999999999999999999", "no model has that many blocks"),
    ("attn@5-1", "the range 5-1 is empty"),
    ("attn@", "no blocks after '@'"),
    ("attn@ ", "no blocks after '@'"),
    ("lora@3-1", "the range 3-1 is empty"),
    ("lora:r=16,r=8", "option r is given twice"),
    ("lora:alpha=inf", "alpha must be a positive finite number"),
    ("lora:alpha=nan", "alpha must be a positive finite number"),
    ("lora:r=1000000000", "r must be an integer from 1 to 65536"),
    ("lora:r=1" + "0" * 200, "is not a int"),
    ("lora:r=1" + "0" * 400, "a spec is at most 256"),
])
def test_a_bad_spec_is_refused_at_once_without_building_anything(spec, words):
    start = time.perf_counter()
    with pytest.raises(UnknownPolicyError) as error:
        parse_method(spec)
    assert words in str(error.value) and time.perf_counter() - start < 1
    assert len(str(error.value)) < 300


def test_a_policy_that_trains_nothing_is_refused_before_any_optimizer():
    with pytest.raises(UnknownPolicyError, match="trains nothing"):
        apply_policy(tiny_model("vit"), "attn-attention-head-pos_embed")


def test_a_policy_that_is_not_a_spec_raises_attnfts_own_error():
    with pytest.raises(UnknownPolicyError, match="not NoneType"):
        apply_policy(tiny_model("vit"), None)


def test_a_lora_rank_above_the_layers_width_is_refused_before_peft_allocates():
    from attnft.methods.peft.model import apply_peft_policy

    model = tiny_model("vit")  # 32 wide: qkv 32 -> 96
    with pytest.raises(UnknownPolicyError, match=r"r=97 is above the width of every targeted layer .* \(at most 96\)"):
        apply_peft_policy(model, "lora:r=97")
    apply_peft_policy(tiny_model("vit"), "lora:r=96")


def test_through_the_cli_an_empty_range_is_one_line_exit_2(capsys):
    assert main(["policies", "vit_fmnist_patch4_28", "--policy", "attn@5-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "empty" in err[0]


def test_ranges_still_read_as_before():
    assert Policy.parse("attn@1-3,5").blocks == frozenset({1, 2, 3, 5})
    assert Policy.parse("attn@4").blocks == frozenset({4})
    assert issubclass(UnknownPolicyError, AttnftError)
