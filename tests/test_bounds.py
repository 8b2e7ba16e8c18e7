"""Values that hung, exhausted memory, overflowed or were accepted silently are refused in one
line with exit code 2, nothing written (issue: robustness, round two)."""
import os

import pytest
import torch

from attnft.training.checkpoints import latest_checkpoint
from attnft.cli import main
from test_runner import finetune_args, tiny  # noqa: F401  (the fixture)


def assert_refused(capsys, argv, *words, tmp_path=None):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnft: error:"), captured.err
    for word in words:
        assert word in lines[0], lines[0]
    if tmp_path is not None:
        assert not (tmp_path / "run").exists() and not (tmp_path / "store").exists()


@pytest.mark.parametrize("flags, words", [
    (["--workers", "1000000"], ["workers must be from 0 to", "per core"]),
    (["--auto-augment", "rand-m9-n100000"], ["n must be from 0 to 16"]),
    (["--auto-augment", "rand-m9999"], ["m must be from 0 to 10"]),
    (["--warmup-epochs", "1e308"], ["warmup_epochs must be from 0 to"]),
    (["--grad-accum", "100000000000000000000"], ["grad_accum must be from 1 to"]),
    (["--batch-size", "100000000000000000000"], ["batch_size must be from 1 to"]),
    (["--mixup", "1e308"], ["mixup must be from 0 to 100"]),
    (["--teacher", "vit_fmnist_patch4_28", "--distillation", "soft", "--distillation-tau", "1e308"], ["distillation_tau"]),
    (["--teacher", "vit_fmnist_patch4_28", "--distillation", "soft", "--distillation-tau", "1e-300"], ["distillation_tau"]),
])
def test_finetune_refuses_at_parse_time(tmp_path, capsys, flags, words):
    argv = ["finetune", "--model", "vit_fmnist_patch4_28", "--max-train", "64", "--max-eval", "64", "--epochs", "1",
            "--store", str(tmp_path / "store"), "--output-dir", str(tmp_path / "run"), "--no-progress", *flags]
    assert_refused(capsys, argv, *words, tmp_path=tmp_path)


@pytest.mark.parametrize("flags, words", [
    (["--workers", "1000000"], ["workers must be from 0 to"]),
    (["--batch-size", "100000000000000000000"], ["batch_size must be from 1 to"]),
])
def test_eval_refuses_at_parse_time(capsys, flags, words):
    assert_refused(capsys, ["eval", "--model", "vit_fmnist_patch4_28", *flags], *words)


@pytest.mark.parametrize("command", ["finetune", "eval"])
def test_a_mistyped_inat_category_is_refused_before_the_model_is_looked_for(tmp_path, capsys, command):
    argv = [command, "--model", "hf-hub:nobody/no-such-model", "--dataset", "inat2018", "--data-dir", str(tmp_path),
            "--inat-category", "species"]
    assert_refused(capsys, argv, "--inat-category species: choose one of name, genus, family")


def test_more_accumulation_than_an_epoch_has_batches_is_refused_before_training(tiny, tmp_path, capsys):  # noqa: F811
    model, data = tiny  # 48 training images: 6 batches of 8
    assert_refused(capsys, finetune_args(model, data, tmp_path, "--grad-accum", "7"),
                   "--grad-accum 7 accumulates more batches than an epoch has (6 of 8)")
    assert not (tmp_path / "store").exists()


def test_a_checkpoint_whose_step_is_beyond_the_run_is_refused(tiny, tmp_path, capsys):  # noqa: F811
    model, data = tiny
    argv = finetune_args(model, data, tmp_path, "--steps", "4", "--checkpoint-every", "2", "--no-eval-before",
                         "--eval-every", "0")
    assert main(argv) == 0
    path = latest_checkpoint(tmp_path / "run" / "checkpoints")
    state = torch.load(path, weights_only=True)
    state["position"]["step"] = 10**30
    torch.save(state, path)
    capsys.readouterr()
    assert_refused(capsys, argv + ["--resume", "--overwrite"], "is not a step of this 4-step run")
    assert os.path.exists(path)


@pytest.mark.parametrize("flags, words", [
    (["--train-split", "train+train"], ["names train twice"]),
    (["--train-split", "train+"], ["has an empty part"]),
])
def test_a_split_named_twice_or_empty_is_refused(tmp_path, capsys, flags, words):
    argv = ["finetune", "--dataset", str(tmp_path), "--store", str(tmp_path / "store"),
            "--output-dir", str(tmp_path / "run"), "--no-progress", *flags]
    assert_refused(capsys, argv, *words, tmp_path=tmp_path)


def test_a_label_column_that_is_the_image_column_is_refused(tiny, tmp_path, capsys):  # noqa: F811
    model, data = tiny
    assert_refused(capsys, finetune_args(model, data, tmp_path, "--label-key", "image"),
                   "the label column and the image column", "are both 'image'")


@pytest.mark.parametrize("fraction, words", [
    ("0.9999999", ["holding out 0.9999999 of", "gives 48 of 48 images"]),
    ("1e-9", ["holding out 1e-09 of", "gives 1 of 48 images"]),
])
def test_a_hold_out_that_leaves_a_side_without_every_class_is_refused(tiny, tmp_path, capsys, fraction, words):  # noqa: F811
    model, data = tiny
    argv = finetune_args(model, os.path.join(data, "train"), tmp_path, "--val-fraction", fraction)
    assert_refused(capsys, argv, *words, "--val-fraction", tmp_path=tmp_path)


def test_a_saved_dataset_with_an_empty_test_split_is_refused_by_name_in_finetune_and_eval(tiny, tmp_path, capsys):  # noqa: F811
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image

    model, _ = tiny
    features = Features({"image": Image(), "label": ClassLabel(names=["a", "b"])})
    rows = Dataset.from_dict({"image": [torch.zeros(3, 8, 8).numpy().transpose(1, 2, 0).astype("uint8")] * 4,
                              "label": [0, 1, 0, 1]}, features=features)
    saved = tmp_path / "saved"
    DatasetDict(train=rows, test=rows.select([])).save_to_disk(saved)
    capsys.readouterr()  # datasets' progress bar
    message = f"split 'test' of saved dataset {saved} is empty"
    assert_refused(capsys, finetune_args(model, str(saved), tmp_path), message, tmp_path=tmp_path)
    assert_refused(capsys, ["eval", "--model", model, "--dataset", str(saved), "--split", "test"], message)


def test_an_inat_category_level_for_a_dataset_without_a_taxonomy_is_refused(tiny, tmp_path, capsys):  # noqa: F811
    model, data = tiny
    assert_refused(capsys, finetune_args(model, data, tmp_path, "--inat-category", "genus"),
                   "--inat-category is for the iNaturalist presets with a taxonomy (inat2018, inat2019)",
                   tmp_path=tmp_path)


def test_finetune_on_inaturalist_at_the_genus_level_trains_a_head_of_its_genera(tiny, tmp_path):  # noqa: F811
    import json

    from test_data import INAT_SPLITS, NUMBERED, TAXONOMY, write_inat_json

    model, _ = tiny
    root = write_inat_json(tmp_path / "inat", NUMBERED, INAT_SPLITS, taxonomy=TAXONOMY)
    argv = finetune_args(model, "inat2018", tmp_path, "--data-dir", str(root), "--inat-category", "genus",
                         "--epochs", "1", "--batch-size", "2", "--name", "genera")
    assert main(argv) == 0
    config = json.loads((tmp_path / "store" / "genera" / "adapter_config.json").read_text())
    assert config["label_names"] == ["Fagus", "Quercus"] and config["training"]["inat_category"] == "genus"


def test_eval_of_an_inaturalist_adapter_reads_the_copy_at_the_level_it_was_trained_at(tiny, tmp_path, capsys):  # noqa: F811
    import json

    from test_data import INAT_SPLITS, NUMBERED, TAXONOMY, write_inat_json

    model, _ = tiny
    root = write_inat_json(tmp_path / "inat", NUMBERED, INAT_SPLITS, taxonomy=TAXONOMY)
    argv = finetune_args(model, "inat2018", tmp_path, "--data-dir", str(root), "--inat-category", "genus",
                         "--epochs", "1", "--batch-size", "2", "--name", "genera")
    assert main(argv) == 0
    capsys.readouterr()
    evaluate = ["eval", "--adapter", "genera", "--store", str(tmp_path / "store"), "--dataset", "inat2018",
                "--data-dir", str(root), "--workers", "0", "--no-progress"]
    assert main(evaluate) == 0  # no --inat-category: the adapter's genus, not the species (3 classes, not 2)
    assert sorted(json.loads(capsys.readouterr().out)["per_class"]) == ["Fagus", "Quercus"]
    assert main(evaluate + ["--inat-category", "genus"]) == 0
    capsys.readouterr()
    assert_refused(capsys, evaluate + ["--inat-category", "name"],
                   "adapter genera classifies inat2018 at --inat-category genus, not name: leave out --inat-category")
    config_file = tmp_path / "store" / "genera" / "adapter_config.json"  # as an adapter from before the record
    config = json.loads(config_file.read_text())
    del config["training"]["inat_category"]
    config_file.write_text(json.dumps(config))
    assert main(evaluate + ["--inat-category", "genus"]) == 0  # no record: the level asked for
    assert sorted(json.loads(capsys.readouterr().out)["per_class"]) == ["Fagus", "Quercus"]


def test_a_step_that_needs_more_memory_than_the_machine_has_is_refused_before_anything_is_written(tiny, tmp_path, capsys, monkeypatch):  # noqa: F811
    from attnft.tuning import step_memory

    model, data = tiny  # 2 blocks of 17 tokens x 32, batch 8 at 32 px: at least 446 kB (348 kB of activations)
    monkeypatch.setattr(step_memory, "device_memory", lambda device: 350_000)
    assert_refused(capsys, finetune_args(model, data, tmp_path),
                   "--batch-size 8 at 32 px needs at least 446.46 kB for one training step of",
                   "(the activations of 2 blocks of 17 tokens x 32, and the images), more than the 350.00 kB of "
                   "this machine's RAM: pass --batch-size 4 --grad-accum 2 (keeps the global batch), "
                   "a smaller --res, or --grad-checkpointing", tmp_path=tmp_path)
    # checkpointed, each block keeps its input and one block is recomputed: 307 kB, and the run trains
    assert main(finetune_args(model, data, tmp_path, "--grad-checkpointing", "--epochs", "1")) == 0
    assert (tmp_path / "store").exists()


def test_the_memory_check_counts_the_batches_the_loaders_workers_hold(tiny, tmp_path, capsys, monkeypatch):  # noqa: F811
    from attnft.tuning import step_memory

    model, data = tiny  # 446.46 kB a step with 98.30 kB of images; 2 workers prefetch 2 batches each
    monkeypatch.setattr(step_memory, "device_memory", lambda device: 500_000)
    argv = finetune_args(model, data, tmp_path)
    assert_refused(capsys, argv[:argv.index("--workers")] + ["--workers", "2"] + argv[argv.index("--workers") + 2:],
                   "needs at least 839.68 kB", "the images, and the loader's 4 batches in flight", tmp_path=tmp_path)
