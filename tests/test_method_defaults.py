"""Each policy and peft method trains at its own learning rate, stated at batch 64 and scaled with the global batch;
``--lr`` and a recipe's ``lr`` win; the run says which lr it uses and why, and config.yaml records it."""
import pytest
import yaml

from attnft.cli import main
from attnft.methods.defaults import BASE_BATCH, TrainingDefaults
from attnft.methods import parse_method
from attnft.methods.peft.spec import PEFT_METHODS
from attnft.methods.freeze.policy import BASE_DEFAULTS


def test_every_method_family_has_its_own_default_with_a_source():
    for defaults in [*BASE_DEFAULTS.values(), *(m.defaults for m in PEFT_METHODS.values())]:
        assert 0 < defaults.lr < 1 and defaults.base_batch == BASE_BATCH and defaults.source
    # the methods that start from nothing (a new head, zero-initialised or unit scales) take larger steps
    assert BASE_DEFAULTS["head"].lr > BASE_DEFAULTS["attn"].lr
    assert PEFT_METHODS["lora"].defaults.lr > BASE_DEFAULTS["attn"].lr


@pytest.mark.parametrize("spec, family", [("attn", "attn"), ("head+bias", "head"), ("ffn+norm@0-1", "ffn"),
                                          ("lora:r=4", "lora"), ("ia3+ffn", "ia3")])
def test_an_edited_policy_trains_at_its_bases_default(spec, family):
    method = parse_method(spec)
    assert method.family == family
    expected = BASE_DEFAULTS[family] if family in BASE_DEFAULTS else PEFT_METHODS[family].defaults
    assert method.defaults == expected


def test_the_default_scales_linearly_with_the_global_batch():
    defaults = TrainingDefaults(2e-3, "a test")
    assert defaults.lr_for(64) == 2e-3 and defaults.lr_for(256) == pytest.approx(8e-3)
    assert defaults.explain("lora", 64) == "lr 2.0e-03: lora's default at batch 64"
    assert defaults.explain("lora", 128) == ("lr 4.0e-03: lora's default 2.0e-03 at batch 64, x 128/64 for a global "
                                             "batch of 128")


def test_the_default_warmup_is_a_share_of_the_run():
    defaults = TrainingDefaults(1e-2, "a test", warmup=0.2)
    assert defaults.warmup_epochs_for(5) == pytest.approx(1.0) and defaults.warmup_epochs_for(1) == pytest.approx(0.2)
    assert defaults.explain_warmup("lora", 5) == "warmup 1 epochs: lora's default, 20% of the run"
    assert TrainingDefaults(1e-2, "a test").explain_warmup("attn", 5) == ""  # no warmup, nothing to say


def _run(tmp_path, *extra):
    return ["finetune", "--model", "vit_fmnist_patch4_28", "--max-train", "64", "--max-eval", "32", "--steps", "1",
            "--workers", "0", "--no-progress", "--no-eval-before", "--output-dir", str(tmp_path / "run"),
            "--store", str(tmp_path / "store"), *extra]


@pytest.mark.parametrize("policy, batch, accum", [("head", 32, 1), ("lora", 16, 2), ("attn", 64, 1)])
def test_a_run_without_lr_uses_its_policys_default_at_its_global_batch_and_says_so(capsys, tmp_path, policy, batch, accum):
    assert main(_run(tmp_path, "--policy", policy, "--batch-size", str(batch), "--grad-accum", str(accum))) == 0
    out = capsys.readouterr().out
    defaults = parse_method(policy).defaults
    expected = defaults.lr * batch * accum / 64
    line = next(line for line in out.splitlines() if line.startswith("lr "))
    assert line.split("; ")[0] == defaults.explain(policy, batch * accum)
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["lr"] == pytest.approx(expected)
    # the warmup: the method's share of the run (--steps 1 over 64 images at this global batch), said when there is one
    epochs = batch * accum / 64
    assert config["warmup_epochs"] == pytest.approx(defaults.warmup * epochs)
    assert (defaults.warmup > 0) == ("warmup" in line)


def test_warmup_epochs_on_the_command_line_wins(capsys, tmp_path):
    assert main(_run(tmp_path, "--policy", "lora", "--batch-size", "32", "--warmup-epochs", "0")) == 0
    assert "warmup" not in next(line for line in capsys.readouterr().out.splitlines() if line.startswith("lr "))
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["warmup_epochs"] == 0


def test_lr_on_the_command_line_or_in_a_recipe_wins(capsys, tmp_path):
    assert main(_run(tmp_path, "--policy", "head", "--batch-size", "32", "--lr", "3e-4")) == 0
    assert "lr 3.0e-04: as set (--lr or the recipe)" in capsys.readouterr().out
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("policy: head\nlr: 7.0e-4\nbatch_size: 32\n")
    assert main(_run(tmp_path, "--recipe", str(recipe), "--overwrite")) == 0
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["lr"] == pytest.approx(7e-4)


@pytest.mark.parametrize("policy, says", [("lora", "after a linear warmup over 20% of the run"), ("attn", "after no warmup")])
def test_policies_prints_the_default_lr_and_warmup_with_their_source(capsys, policy, says):
    assert main(["policies", "vit_fmnist_patch4_28", "--policy", policy]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("default lr:"))
    defaults = parse_method(policy).defaults
    assert f"{defaults.lr:.1e} at batch 64" in line and says in line and defaults.source in line
