"""attnft eval and attnft.evaluate: top-1, top-5 and per-class accuracy counted exactly, as JSON."""
import json
import math

import pytest
import torch
from torch import nn

from attnft.cli import main
from attnft.training.evaluate import evaluate
from test_runner import one_thread_and_private_caches, write_color_folder, write_tiny_model  # noqa: F401  (fixture)

LABELS = ["a", "b", "c", "d", "e", "f", "g"]


class FixedLogits(nn.Module):
    """Returns the logits row whose index is written in the image's first pixel."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = nn.Parameter(logits, requires_grad=False)

    def forward(self, images):
        return self.logits[images[:, 0, 0, 0].long()]


def batches(labels, batch_size):
    for start in range(0, len(labels), batch_size):
        index = torch.arange(start, min(start + batch_size, len(labels)))
        images = torch.zeros(len(index), 3, 2, 2)
        images[:, 0, 0, 0] = index.float()
        yield images, torch.tensor(labels[start:start + batch_size])


def test_top1_top5_and_per_class_accuracy_are_counted_exactly():
    # sample 0: right; 1: label ranked 2nd; 2: ranked 6th (outside the top 5); 3: right
    logits = torch.tensor([
        [9.0, 1, 2, 3, 4, 5, 6],
        [1.0, 8, 9, 3, 4, 5, 6],
        [6.0, 1, 5, 4, 3, 2, 9],
        [0.0, 0, 0, 9, 0, 0, 0],
    ])
    labels = [0, 1, 1, 3]
    result = evaluate(FixedLogits(logits), list(batches(labels, 3)), LABELS)
    assert result.num_samples == 4
    assert result.top1 == 50.0 and result.top5 == 75.0
    assert result.per_class["a"] == {"accuracy": 100.0, "samples": 1}
    assert result.per_class["b"] == {"accuracy": 0.0, "samples": 2}
    assert result.per_class["d"] == {"accuracy": 100.0, "samples": 1}
    assert result.per_class["e"] == {"accuracy": None, "samples": 0}  # no sample: no accuracy
    expected_loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels)).item()
    assert result.loss == pytest.approx(expected_loss)


def test_batches_of_unreadable_images_are_skipped():
    logits = torch.eye(7)
    loader = [None, *batches([0, 1, 2], 2), None]
    result = evaluate(FixedLogits(logits), loader, LABELS)
    assert result.num_samples == 3 and result.top1 == 100.0


def test_top5_becomes_top_k_for_fewer_than_five_classes():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    result = evaluate(FixedLogits(logits), list(batches([0], 1)), ["x", "y", "z"])
    assert result.top1 == 0.0 and result.top5 == 100.0


def test_eval_of_a_model_prints_json_with_every_class(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "model", num_classes=3)
    data = write_color_folder(tmp_path / "colors")
    assert main(["eval", "--model", model, "--dataset", data, "--workers", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == model and report["adapter"] is None and report["input_size"] == 32
    assert report["num_samples"] == 18
    assert sorted(report["per_class"]) == ["blue", "green", "red"]
    assert all(entry["samples"] == 6 for entry in report["per_class"].values())
    assert 0 <= report["top1"] <= 100 and report["top5"] == 100.0 and math.isfinite(report["loss"])


def test_eval_of_another_split_and_another_resolution(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "model", num_classes=3)
    data = write_color_folder(tmp_path / "colors")
    assert main(["eval", "--model", model, "--dataset", data, "--split", "train", "--res", "48",
                 "--workers", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["split"] == "train" and report["num_samples"] == 48 and report["input_size"] == 48


def test_eval_refuses_a_head_for_other_classes_and_writes_nothing(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "model", num_classes=5)
    data = write_color_folder(tmp_path / "colors")
    output = tmp_path / "out.json"
    assert main(["eval", "--model", model, "--dataset", data, "--workers", "0", "--output", str(output)]) == 2
    err = capsys.readouterr().err.strip()
    assert "5 classes" in err and "3" in err and "\n" not in err
    assert not output.exists()


def test_eval_of_a_missing_adapter_is_one_line_and_exit_2(tmp_path, capsys):
    data = write_color_folder(tmp_path / "colors")
    assert main(["eval", "--adapter", "nothing-here", "--store", str(tmp_path / "store"), "--dataset", data]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnft: error:") and "nothing-here" in err and "\n" not in err
