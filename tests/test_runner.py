"""attnft finetune: end to end into the store, what it prints and logs, and bad input refused cleanly.

Tiny ViT saved as a timm ``local-dir:`` model, tiny image folders of coloured noise; one
torch thread (2 shared cores: more threads only contend).
"""
import json
import math
import os
import shutil

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from attnft.cli import main
from attnft.training.config import FinetuneConfig
from attnft.training.results import default_adapter_name
from attnft.training.run_folder import MetricsLog
from attnft.training.runner import finetune
from attnft.training.schedule import warmup_cosine_schedule

TINY_ARGS = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
COLORS = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200), "grey": (128, 128, 128)}


# ---- helpers shared by test_eval, test_resume and test_ddp ------------------------------------

def write_tiny_model(directory, num_classes: int = 3, seed: int = 0, label_names=None) -> str:
    """A random tiny ViT (32 px, 8 px patches) saved as timm's local-dir layout; returns its model name."""
    import timm
    from timm.models._hub import save_for_hf

    torch.manual_seed(seed)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=num_classes, **TINY_ARGS)
    save_for_hf(model, str(directory), model_args=dict(TINY_ARGS, num_classes=num_classes),
                model_config={"label_names": list(label_names)} if label_names else None, safe_serialization=True)
    return f"local-dir:{directory}"


def write_color_folder(root, classes=("red", "green", "blue"), train_per_class: int = 16,
                       eval_per_class: int = 6, size: int = 32, seed: int = 0) -> str:
    """root/train|val/<class>/<i>.png: noisy images of the class colour (learnable in a few steps)."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train_per_class), ("val", eval_per_class)):
        for name in classes:
            os.makedirs(os.path.join(root, split, name), exist_ok=True)
            for i in range(count):
                pixels = np.array(COLORS[name]) + rng.normal(0, 50, (size, size, 3))
                Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(os.path.join(root, split, name, f"{i}.png"))
    return str(root)


def finetune_args(model: str, data: str, tmp_path, *extra: str) -> list[str]:
    """Flags of a quick, quiet run writing only under tmp_path."""
    return ["finetune", "--model", model, "--dataset", data, "--store", str(tmp_path / "store"),
            "--output-dir", str(tmp_path / "run"), "--batch-size", "8", "--workers", "0", "--no-progress",
            "--lr", "2e-3", "--warmup-epochs", "0", *extra]


def subprocess_env(tmp_path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp_path / "hf-cache"), PYTHONPATH=_repo_root())
    env.pop("ATTNFT_STORE", None)
    return env


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def one_thread_and_private_caches(tmp_path, monkeypatch):
    """One torch thread (fast and deterministic here); Arrow caches under tmp_path; never the hub;
    no `datasets` progress bars, so that stderr holds only what attnft says."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("ATTNFT_STORE", raising=False)
    yield
    torch.set_num_threads(threads)
    datasets.enable_progress_bars()


@pytest.fixture
def tiny(tmp_path):
    """(model name, image folder) of 3 classes: 48 train / 18 eval images."""
    return write_tiny_model(tmp_path / "model"), write_color_folder(tmp_path / "colors")


# ---- end to end --------------------------------------------------------------------------------

def eval_as_run_reported(tmp_path, data: str, result: dict, name: str = "colors") -> dict:
    """``attnft eval`` of the stored adapter ``name`` on ``data``: its JSON, checked to give the run's own figures."""
    assert main(["eval", "--adapter", name, "--store", str(tmp_path / "store"), "--dataset", data,
                 "--workers", "0", "--batch-size", "8", "--output", str(tmp_path / "eval.json")]) == 0
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    assert evaluated["top1"] == result["accuracy_after"]
    assert evaluated["per_class"] == result["final_eval"]["per_class"]
    assert evaluated["loss"] == pytest.approx(result["final_eval"]["loss"], rel=1e-6)
    return evaluated


def test_finetune_saves_an_adapter_that_attnft_eval_scores_exactly_as_the_run_reported(tiny, tmp_path, capsys):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--res", "48", "--epochs", "3", "--name", "colors")) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["adapter_path"] == str(tmp_path / "store" / "colors")
    assert result["accuracy_after"] > 90.0  # colours are easy; the run did learn

    evaluated = eval_as_run_reported(tmp_path, data, result)
    assert evaluated["input_size"] == 48 and evaluated["num_samples"] == 18
    assert f"accuracy after:  {result['accuracy_after']:.2f}%" in printed
    assert f"adapter saved:   {result['adapter_path']}" in printed


def test_with_no_model_or_dataset_the_bundled_vit_is_fine_tuned_on_fashion_mnist(tmp_path, capsys):
    """The quick demo, `attnft finetune --policy attn --res 384`, cut to a few steps."""
    store = str(tmp_path / "store")
    assert main(["finetune", "--policy", "attn", "--res", "384", "--store", store, "--output-dir", str(tmp_path / "run"),
                 "--max-train", "128", "--max-eval", "64", "--batch-size", "32", "--workers", "0",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "Fashion-MNIST" in printed and "input 384 px" in printed
    name = "vit_fmnist_patch16_224-attn-fashion-mnist-384"
    assert f"adapter saved:   {os.path.join(store, name)}" in printed
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["accuracy_before"] is not None and not result["new_head"]
    assert main(["eval", "--adapter", name, "--store", store, "--max-eval", "64", "--batch-size", "32",
                 "--workers", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["top1"] == result["accuracy_after"]


def test_finetune_prints_accuracy_before_and_adapter_size_against_the_full_checkpoint(tiny, tmp_path, capsys):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "2")) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["accuracy_before"] is not None
    assert f"accuracy before: {result['accuracy_before']:.2f}% (base at 32 px)" in printed
    assert 0 < result["adapter_bytes"] < result["full_checkpoint_bytes"]
    assert "adapter size:" in printed and "vs full checkpoint" in printed
    # attn: attention + head + pos_embed of a 2-block ViT of width 32
    assert result["trainable_params"] == 2 * (32 * 96 + 96 + 32 * 32 + 32) + (32 * 3 + 3) + 17 * 32


def test_a_dataset_with_other_classes_gets_a_new_head_and_no_accuracy_before(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "model", num_classes=3)
    data = write_color_folder(tmp_path / "four", classes=("red", "green", "blue", "grey"), train_per_class=4,
                              eval_per_class=2)
    assert main(finetune_args(model, data, tmp_path, "--steps", "2")) == 0
    printed = capsys.readouterr().out
    assert "accuracy before: n/a: new head" in printed
    assert json.loads((tmp_path / "run" / "result.json").read_text())["accuracy_before"] is None
    config = json.loads((tmp_path / "store" / "model-attn-four-32" / "adapter_config.json").read_text())
    assert config["num_classes"] == 4 and config["label_names"] == ["blue", "green", "grey", "red"]


def test_same_class_count_with_other_label_names_gets_a_new_head(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "model", label_names=["blue", "green", "red"])
    same = write_color_folder(tmp_path / "same", classes=("red", "green", "blue"), train_per_class=4, eval_per_class=2)
    other = write_color_folder(tmp_path / "other", classes=("red", "green", "grey"), train_per_class=4,
                               eval_per_class=2)
    assert main(finetune_args(model, same, tmp_path / "a", "--steps", "1")) == 0
    printed = capsys.readouterr().out
    assert "head: the base's (same classes)" in printed and "accuracy before: " in printed
    assert "before: top-1" not in printed  # the accuracy before is printed once, in the closing lines
    assert main(finetune_args(model, other, tmp_path / "b", "--steps", "1")) == 0
    printed = capsys.readouterr().out
    assert "head: new" in printed and "accuracy before: n/a: new head" in printed
    assert json.loads((tmp_path / "b" / "run" / "result.json").read_text())["new_head"]


def test_a_folder_of_class_folders_trains_and_evaluates_on_a_held_out_share(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "model")
    flat = tmp_path / "flat"
    write_color_folder(flat / "tmp")  # train/ and val/ of 3 classes, then flattened to <class>/ only
    for name in ("red", "green", "blue"):
        os.makedirs(flat / name)
        # plain numbers: `datasets` reads split names out of file names such as train-0.png
        for number, image in enumerate(sorted((flat / "tmp").glob(f"*/{name}/*.png"))):
            image.rename(flat / name / f"{number}.png")
    shutil.rmtree(flat / "tmp")
    assert main(finetune_args(model, str(flat), tmp_path, "--steps", "2", "--val-fraction", "0.25")) == 0
    printed = capsys.readouterr().out
    assert "49 train / 17 eval images" in printed  # 66 images, a quarter held out, rounded up
    assert "held out of train, stratified by class" in printed
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert main(["eval", "--adapter", result["adapter_name"], "--store", str(tmp_path / "store"),
                 "--dataset", str(flat), "--val-fraction", "0.25", "--workers", "0", "--batch-size", "8"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["num_samples"] == 17 and evaluated["top1"] == result["accuracy_after"]


def test_the_augmentation_chosen_is_printed_and_saved_in_config_yaml(tiny, tmp_path, capsys):
    import yaml

    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--epochs", "1", "--hflip", "0.5")) == 0
    assert "augmentation: none (auto: 1 epochs over 48 images): hflip 0.5" in capsys.readouterr().out
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["aug"] == "none" and saved["hflip"] == 0.5 and saved["scale"] == [1.0, 1.0]
    assert saved["crop_pct"] == 1.0


def test_metrics_jsonl_logs_loss_accuracy_lr_and_throughput_every_n_steps(tiny, tmp_path):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--epochs", "2", "--log-every", "2")) == 0
    records = MetricsLog(tmp_path / "run" / "metrics.jsonl").read()
    training = [r for r in records if "loss" in r]
    assert [r["step"] for r in training] == [2, 4, 6, 8, 10, 12]
    assert all(r["images_per_s"] > 0 and 0 <= r["train_acc"] <= 100 and r["lr"] > 0 for r in training)
    evals = [r for r in records if "eval_top1" in r]
    assert evals[0].get("before_training") and evals[-1].get("final")
    assert [r["step"] for r in evals] == [0, 6, 12]  # before, end of epoch 0, final


def test_schedule_warms_up_linearly_then_follows_the_cosine_to_min_lr():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    schedule = warmup_cosine_schedule(optimizer, warmup_steps=4, total_steps=14, min_ratio=0.1)
    lrs = []
    for _ in range(14):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4] == pytest.approx(1.0)
    assert lrs[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_optimizer_holds_only_trainable_weights_and_decays_no_bias_norm_or_pos_embed(tiny, tmp_path, monkeypatch):
    import timm.optim

    captured = {}
    real = timm.optim.create_optimizer_v2

    def spy(model, **kwargs):
        captured["optimizer"] = optimizer = real(model, **kwargs)
        captured["names"] = {id(p): n for n, p in model.named_parameters()}
        return optimizer

    monkeypatch.setattr(timm.optim, "create_optimizer_v2", spy)
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "1", "--weight-decay", "0.05")) == 0
    names = captured["names"]
    groups = {g["weight_decay"]: {names[id(p)] for p in g["params"]} for g in captured["optimizer"].param_groups}
    assert groups[0.05] == {"blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight", "blocks.1.attn.qkv.weight",
                            "blocks.1.attn.proj.weight", "head.weight"}
    assert "pos_embed" in groups[0.0] and "head.bias" in groups[0.0]
    assert not any("mlp" in n or "norm" in n or "patch_embed" in n for g in groups.values() for n in g)


def test_gradient_accumulation_of_two_half_batches_follows_the_full_batch(tiny, tmp_path):
    model, data = tiny
    common = dict(model=model, dataset=data, store=str(tmp_path / "store"), workers=0, progress=False,
                  log_every=1, steps=6, lr=2e-3, eval_before=False)
    finetune(FinetuneConfig(**common, batch_size=8, output_dir=str(tmp_path / "full"), name="full"))
    finetune(FinetuneConfig(**common, batch_size=4, grad_accum=2, output_dir=str(tmp_path / "accum"), name="accum"))
    full = [r["loss"] for r in MetricsLog(tmp_path / "full" / "metrics.jsonl").read() if "loss" in r]
    accum = [r["loss"] for r in MetricsLog(tmp_path / "accum" / "metrics.jsonl").read() if "loss" in r]
    assert len(full) == len(accum) == 6
    assert full == pytest.approx(accum, abs=1e-5)


def test_heavy_augmentation_mixup_drop_path_bf16_and_ffn_recompute_run(tiny, tmp_path):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "3", "--mixup", "0.8", "--cutmix", "1.0",
                              "--auto-augment", "rand-m9-mstd0.5", "--reprob", "0.25", "--drop-path", "0.1",
                              "--precision", "bf16", "--recompute-ffn", "--optimizer", "sgd", "--clip-grad", "1.0",
                              "--no-eval-before")) == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["steps"] == 3 and math.isfinite(result["final_eval"]["loss"])


def test_tensorboard_tracker_writes_event_files_on_request(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "2", "--log-every", "1", "--log-with",
                              "tensorboard", "--no-eval-before")) == 0
    events = [f for _, _, files in os.walk(tmp_path / "run") for f in files if f.startswith("events.out.tfevents")]
    assert events


def _frozen_region_hooks() -> list:
    """The policy's post-step restores registered for every optimizer of this process (torch keeps them global)."""
    from torch.optim.optimizer import _global_optimizer_post_hooks

    from attnft.methods.freeze.policy import _RestoreFrozenRegions

    return [h for h in _global_optimizer_post_hooks.values() if isinstance(h, _RestoreFrozenRegions)]


def test_finetune_leaves_no_global_optimizer_hook_whether_it_returns_or_raises(tmp_path):
    import timm
    from timm.models._hub import save_for_hf

    from attnft.core.errors import ConfigError
    from attnft.models import create_model
    from attnft.methods.freeze.policy import apply_policy

    # ParallelScalingBlock fuses qkv with the FFN's fc1: "attn" splits that tensor, which installs the hook
    args = dict(TINY_ARGS, num_classes=3)
    save_for_hf(timm.create_model("vit_base_patch16_xp_224", pretrained=False, **args), str(tmp_path / "model"),
                model_args=args, safe_serialization=True)
    model = f"local-dir:{tmp_path / 'model'}"
    before = len(_frozen_region_hooks())  # other tests' policies, applied in this process, may still hold theirs
    report = apply_policy(create_model(model), "attn")
    assert report.frozen_regions and len(_frozen_region_hooks()) == before + 1
    report.remove_hooks()
    assert len(_frozen_region_hooks()) == before

    common = dict(model=model, dataset=write_color_folder(tmp_path / "colors"), store=str(tmp_path / "store"),
                  output_dir=str(tmp_path / "run"), batch_size=8, workers=0, progress=False, steps=1,
                  eval_before=False)
    finetune(FinetuneConfig(**common))
    assert len(_frozen_region_hooks()) == before
    with pytest.raises(ConfigError, match="holds another run"):  # refused after the policy was applied
        finetune(FinetuneConfig(**common, name="second"))
    assert len(_frozen_region_hooks()) == before


def test_default_adapter_name_is_model_policy_dataset_resolution():
    assert default_adapter_name("vit_small_patch16_224.augreg_in1k", "attn", "cars", 384) == \
        "vit_small_patch16_224.augreg_in1k-attn-cars-384"
    assert default_adapter_name("hf-hub:timm/vit_base_patch16_224", "attn+norm@8-11", "owner/set", 224) == \
        "vit_base_patch16_224-attn_norm_b8-11-owner-set-224"
    assert default_adapter_name("local-dir:/models/mine/", "attn-pos_embed", "flowers102", 224) == \
        "mine-attn_no_pos_embed-flowers102-224"


# ---- bad input: one line, exit 2, nothing written -----------------------------------------------

def _fails_cleanly(capsys, argv, *, words, untouched):
    """Exit code 2, one line on stderr containing ``words``, and no file under ``untouched`` changed."""
    untouched = [untouched] if not isinstance(untouched, list) else untouched
    before = _snapshot(untouched)
    capsys.readouterr()  # forget what the setup printed
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnft: error:") and "\n" not in err, err
    for word in words:
        assert word in err, err
    assert _snapshot(untouched) == before


def _snapshot(roots) -> dict:
    found = {}
    for directory, _, files in (walked for root in roots for walked in os.walk(root)):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                found[path] = f.read()
    return found


@pytest.fixture
def previous_run(tiny, tmp_path):
    """A finished run and its adapter: the files that a refused command must leave alone."""
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "1", "--no-eval-before", "--name", "kept")) == 0
    return model, data


def test_unknown_dataset_is_refused(previous_run, tmp_path, capsys):
    model, _ = previous_run
    _fails_cleanly(capsys, finetune_args(model, "no-such-preset", tmp_path, "--overwrite", "--name", "kept"),
                   words=["unknown dataset", "no-such-preset"], untouched=tmp_path / "run")


def test_folder_without_images_is_refused(previous_run, tmp_path, capsys):
    model, _ = previous_run
    empty = tmp_path / "empty"
    (empty / "train" / "cat").mkdir(parents=True)
    (empty / "train" / "cat" / "notes.txt").write_text("no images here")
    _fails_cleanly(capsys, finetune_args(model, str(empty), tmp_path, "--overwrite", "--name", "kept"),
                   words=["no images"], untouched=[tmp_path / "run", tmp_path / "store"])


def test_missing_label_column_is_refused(previous_run, tmp_path, capsys):
    model, _ = previous_run
    saved = tmp_path / "saved"
    rows = datasets.Dataset.from_dict({"image": [Image.new("RGB", (32, 32))] * 4, "tag": ["a", "b", "a", "b"]},
                                      features=datasets.Features({"image": datasets.Image(),
                                                                  "tag": datasets.Value("string")}))
    datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(str(saved))
    _fails_cleanly(capsys, finetune_args(model, str(saved), tmp_path, "--label-key", "label", "--overwrite",
                                         "--name", "kept"),
                   words=["label column", "'label'"], untouched=tmp_path / "run")


def test_missing_image_column_is_refused(previous_run, tmp_path, capsys):
    model, _ = previous_run
    saved = tmp_path / "saved"
    rows = datasets.Dataset.from_dict({"text": ["x", "y", "x", "y"], "label": [0, 1, 0, 1]},
                                      features=datasets.Features({"text": datasets.Value("string"),
                                                                  "label": datasets.ClassLabel(names=["a", "b"])}))
    datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(str(saved))
    _fails_cleanly(capsys, finetune_args(model, str(saved), tmp_path, "--overwrite", "--name", "kept"),
                   words=["holds the image", "columns: text, label", "--image-key"], untouched=tmp_path / "run")


def test_resolution_not_divisible_by_the_patch_size_is_refused(previous_run, tmp_path, capsys):
    model, data = previous_run
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--res", "50", "--overwrite", "--name", "kept"),
                   words=["50"], untouched=tmp_path / "run")


def test_batch_larger_than_the_dataset_is_refused(previous_run, tmp_path, capsys):
    model, data = previous_run
    argv = finetune_args(model, data, tmp_path, "--overwrite", "--name", "kept")
    argv[argv.index("--batch-size") + 1] = "64"
    _fails_cleanly(capsys, argv, words=["batch size 64", "48 samples"], untouched=tmp_path / "run")


def test_hub_model_while_offline_is_refused(previous_run, tmp_path, capsys, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    _, data = previous_run
    _fails_cleanly(capsys, finetune_args("hf-hub:someone/not-cached-vit", data, tmp_path, "--overwrite",
                                         "--name", "kept"),
                   words=["hf-hub:someone/not-cached-vit"], untouched=tmp_path / "run")


def test_existing_adapter_name_is_refused_before_training(previous_run, tmp_path, capsys):
    model, data = previous_run
    shutil.rmtree(tmp_path / "run")  # only the store stands in the way
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--name", "kept"),
                   words=["'kept'", "--overwrite"], untouched=[tmp_path / "store"])
    assert not (tmp_path / "run").exists()


def test_output_dir_of_another_run_is_refused_without_resume_or_overwrite(previous_run, tmp_path, capsys):
    model, data = previous_run
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--name", "other"),
                   words=["--resume", "--overwrite"], untouched=[tmp_path / "run", tmp_path / "store"])


def test_a_policy_typo_is_the_first_thing_refused(tmp_path):
    """Before the Accelerator is built and its own checks run (fp16 on the CPU would be refused too)."""
    from attnft.core.errors import UnknownPolicyError

    with pytest.raises(UnknownPolicyError, match="atn"):
        finetune(FinetuneConfig(policy="atn", precision="fp16", cpu=True, store=str(tmp_path / "store"),
                                output_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists() and not (tmp_path / "store").exists()


def test_unknown_recipe_key_is_refused(previous_run, tmp_path, capsys):
    model, data = previous_run
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("lr: 1e-4\nlearning_rate: 1e-4\n")
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--recipe", str(recipe)),
                   words=["learning_rate"], untouched=tmp_path / "run")


@pytest.mark.parametrize("policy", ["lora", "ia3"])
def test_peft_policy_finetunes_into_peft_format_that_attnft_eval_and_plain_peft_reload(tiny, tmp_path, capsys, policy):
    from peft import PeftModel

    from attnft.models import create_model
    from attnft.methods.peft.sidecar import is_peft_adapter
    from attnft.adapters.store import AdapterStore

    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--policy", policy, "--epochs", "3", "--lr", "1e-2",
                              "--name", "colors")) == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    adapter = tmp_path / "store" / "colors"
    assert is_peft_adapter(adapter) and (adapter / "adapter_model.safetensors").is_file()
    assert result["trainable_params"] < result["total_params"] / 2

    assert main(["eval", "--adapter", "colors", "--store", str(tmp_path / "store"), "--dataset", data,
                 "--workers", "0", "--batch-size", "8", "--output", str(tmp_path / "eval.json")]) == 0
    assert json.loads((tmp_path / "eval.json").read_text())["top1"] == result["accuracy_after"]

    plain = PeftModel.from_pretrained(create_model(model), str(adapter)).eval()  # peft alone, no attnft loader
    ours = AdapterStore(tmp_path / "store").load("colors", create_model(model))
    x = torch.randn(4, 3, result["input_size"], result["input_size"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(plain(x), ours(x))


@pytest.mark.parametrize("policy", ["attn", "lora"])
def test_a_run_walks_the_model_for_its_role_map_once(tmp_path, monkeypatch, policy):
    # the @BLOCKS check, the new head and the method share one map (the head re-read, not the model walked again)
    import sys

    import attnft.roles

    walks = []
    original = attnft.roles.build_role_map

    def counted(model):
        walks.append(type(model).__name__)
        return original(model)

    for module in [m for m in list(sys.modules.values()) if getattr(m, "build_role_map", None) is original]:
        monkeypatch.setattr(module, "build_role_map", counted)
    model = write_tiny_model(tmp_path / "model", num_classes=3)
    data = write_color_folder(tmp_path / "four", classes=("red", "green", "blue", "grey"), train_per_class=4,
                              eval_per_class=2)
    assert main(finetune_args(model, data, tmp_path, "--steps", "1", "--policy", policy)) == 0
    assert len(walks) == 1
