"""attnft finetune with a teacher: the distilled student's two heads, the teacher from the store, bitwise resume."""
import json

import timm
import torch
import yaml
from safetensors.torch import load_file
from timm.models._hub import save_for_hf

from attnft.cli import main
from test_runner import (  # noqa: F401
    TINY_ARGS,
    finetune_args,
    one_thread_and_private_caches,
    write_color_folder,
    write_tiny_model,
)


def write_tiny_distilled(directory) -> str:
    torch.manual_seed(1)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, num_classes=3, **TINY_ARGS)
    save_for_hf(model, str(directory), model_args=dict(TINY_ARGS, num_classes=3), safe_serialization=True)
    return f"local-dir:{directory}"


def test_a_distilled_student_learns_from_a_teacher_in_the_store_and_saves_the_settings(tmp_path, capsys):
    data = write_color_folder(tmp_path / "colors")
    teacher = write_tiny_model(tmp_path / "teacher")
    assert main(finetune_args(teacher, data, tmp_path / "t", "--policy", "full", "--steps", "6", "--name", "teach",
                              "--store", str(tmp_path / "store"))) == 0
    student = write_tiny_distilled(tmp_path / "student")
    assert main(finetune_args(student, data, tmp_path / "s", "--steps", "3", "--teacher-adapter", "teach",
                              "--store", str(tmp_path / "store"), "--distillation", "soft",
                              "--distillation-tau", "2")) == 0
    printed = capsys.readouterr().out
    assert "teacher: local-dir:" in printed and "+ adapter teach at 32 px" in printed and "soft" in printed
    assert "s training loop (" in printed and "MB of weights" in printed  # its time and memory
    saved = yaml.safe_load((tmp_path / "s" / "run" / "config.yaml").read_text())
    assert (saved["distillation"], saved["distillation_tau"], saved["teacher_adapter"]) == ("soft", 2.0, "teach")
    name = json.loads((tmp_path / "s" / "run" / "result.json").read_text())["adapter_name"]
    config = json.loads((tmp_path / "store" / name / "adapter_config.json").read_text())
    assert config["training"]["distillation"]["type"] == "soft"
    assert "head_dist.weight" in config["tensors"]  # the distillation head trained (on the teacher's term)


def test_a_teacher_for_other_classes_is_refused_before_training(tmp_path, capsys):
    data = write_color_folder(tmp_path / "colors")
    teacher = write_tiny_model(tmp_path / "teacher", num_classes=5)
    assert main(finetune_args(write_tiny_model(tmp_path / "student"), data, tmp_path, "--steps", "1",
                              "--teacher", teacher)) == 2
    err = capsys.readouterr().err.strip()
    assert "predicts 5 classes, the task has 3" in err and "\n" not in err
    assert not (tmp_path / "run").exists()


def test_distillation_without_a_teacher_is_a_config_error(tmp_path, capsys):
    data = write_color_folder(tmp_path / "colors")
    assert main(finetune_args(write_tiny_model(tmp_path / "m"), data, tmp_path, "--distillation", "hard")) == 2
    assert "needs a teacher" in capsys.readouterr().err


def test_a_run_with_a_teacher_resumes_bitwise(tmp_path):
    data = write_color_folder(tmp_path / "colors")
    teacher, student = write_tiny_model(tmp_path / "teacher"), write_tiny_distilled(tmp_path / "student")
    common = ["--steps", "8", "--checkpoint-every", "3", "--no-eval-before", "--eval-every", "0", "--teacher",
              teacher, "--mixup", "0.8", "--aug", "light"]
    assert main(finetune_args(student, data, tmp_path / "a", *common)) == 0
    assert main(finetune_args(student, data, tmp_path / "b", *common, "--name", "b")) == 0
    checkpoints = tmp_path / "b" / "run" / "checkpoints"
    for path in checkpoints.iterdir():
        if path.name != "step_00000003.pt":
            path.unlink()
    assert main(finetune_args(student, data, tmp_path / "b", *common, "--name", "b", "--resume", "--overwrite")) == 0
    name = json.loads((tmp_path / "a" / "run" / "result.json").read_text())["adapter_name"]
    a = load_file(str(tmp_path / "a" / "store" / name / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "b" / "store" / "b" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
