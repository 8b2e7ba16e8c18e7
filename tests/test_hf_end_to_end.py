"""A transformers ViT end to end: finetune -> adapter in the store -> eval, merged export and peft adapter
loaded by plain transformers / peft in a fresh process, mixed-task batches.

A tiny ViT written by ``save_pretrained`` and a folder of ~40 noisy colour images; one torch thread.
"""
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

from attnft.methods.record import AdapterRecord
from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.methods.freeze.load import load_adapter
from attnft.cli import main
from attnft.models import create_model
from attnft.multitask import MultiTaskModel
from attnft.methods.peft.model import apply_peft_policy
from attnft.methods.freeze.policy import apply_policy
from attnft.adapters.store import AdapterStore
from snippets import python_blocks, run_isolated, run_with_logits, uses_attnft

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
            patch_size=8, num_labels=3)
COLORS = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200)}


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.delenv("ATTNFT_STORE", raising=False)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """``transformers:DIR`` of a random tiny ViT with its image processor."""
    folder = tmp_path_factory.mktemp("vit")
    torch.manual_seed(0)
    ViTForImageClassification(ViTConfig(**TINY)).save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.25] * 3).save_pretrained(folder)
    return f"transformers:{folder}"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """root/train|val/<colour>/<i>.png: 30 train and 12 eval images of 3 classes."""
    root = tmp_path_factory.mktemp("colors")
    rng = np.random.default_rng(0)
    for split, count in (("train", 10), ("val", 4)):
        for name, rgb in COLORS.items():
            os.makedirs(root / split / name)
            for i in range(count):
                pixels = np.clip(np.array(rgb) + rng.normal(0, 60, (32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return str(root)


@pytest.fixture(scope="module")
def finetuned(base, images, tmp_path_factory):
    """`attnft finetune --model transformers:DIR --policy attn --res 48`: (store dir, result.json)."""
    root = tmp_path_factory.mktemp("run")
    argv = ["finetune", "--model", base, "--policy", "attn", "--res", "48", "--dataset", images,
            "--store", str(root / "store"), "--output-dir", str(root / "run"), "--batch-size", "8", "--workers", "0",
            "--no-progress", "--lr", "2e-3", "--warmup-epochs", "0", "--epochs", "2", "--name", "colors"]
    assert main(argv) == 0
    return root / "store", json.loads((root / "run" / "result.json").read_text())


def merged(base: str, store_dir, name: str):
    model = create_model(base, img_size=48)
    load_adapter(model, AdapterStore(store_dir).read(name))
    return model.eval()


def plain_logits(code: str, x: torch.Tensor, cwd) -> torch.Tensor:
    """Logits printed by ``code`` (which defines ``logits(x)``) run where attnft cannot be imported."""
    torch.save(x, cwd / "x.pt")
    runner = f"""{code}
import json, torch
with torch.no_grad():
    print("LOGITS " + json.dumps(logits(torch.load({str(cwd / 'x.pt')!r})).tolist()))
"""
    result = run_isolated(runner, cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("LOGITS "))
    return torch.tensor(json.loads(line[len("LOGITS "):]))


def test_the_adapter_is_in_the_store_and_records_how_to_create_the_base(finetuned, base):
    store_dir, result = finetuned
    config = AdapterStore(store_dir).verify("colors")
    assert config.model_name == base and config.input_size == 48 and config.policy == "attn"
    assert "vit.layers.0.attention.o_proj.weight" in config.tensors  # attention's output projection trained
    assert not [n for n in config.tensors if ".mlp." in n]  # the FFN's did not
    assert result["input_size"] == 48


def test_attnft_eval_reproduces_the_runs_accuracy(finetuned, images, tmp_path):
    store_dir, result = finetuned
    assert main(["eval", "--adapter", "colors", "--store", str(store_dir), "--dataset", images, "--workers", "0",
                 "--batch-size", "8", "--output", str(tmp_path / "eval.json")]) == 0
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    assert evaluated["top1"] == result["accuracy_after"]
    assert evaluated["per_class"] == result["final_eval"]["per_class"]
    assert evaluated["loss"] == pytest.approx(result["final_eval"]["loss"], rel=1e-6)
    assert evaluated["input_size"] == 48 and evaluated["num_samples"] == 12


def test_the_merged_export_loads_in_plain_transformers_with_the_same_logits(finetuned, base, tmp_path, capsys):
    store_dir, _ = finetuned
    out = tmp_path / "export"
    assert main(["adapters", "export", "colors", "--store", str(store_dir), "--out", str(out)]) == 0
    assert "load it with transformers alone" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["ViTForImageClassification"] and config["image_size"] == 48
    assert list(config["id2label"].values()) == ["blue", "green", "red"]
    code = f"""
from transformers import AutoModelForImageClassification
model = AutoModelForImageClassification.from_pretrained({str(out)!r}).eval()
logits = lambda x: model(x).logits
"""
    x = torch.randn(3, 3, 48, 48)
    with torch.no_grad():
        expected = merged(base, store_dir, "colors")(x)
    assert torch.allclose(plain_logits(code, x, tmp_path), expected, atol=1e-5)


def plain_card_block(folder) -> str:
    """The adapter card's code that loads it with transformers alone, its ``model`` made to return logits."""
    (block,) = [b for b in python_blocks((folder / "README.md").read_text()) if not uses_attnft(b)]
    return block + "\n_loaded = model\nmodel = lambda x: _loaded(x).logits\n"


def test_the_adapter_cards_plain_transformers_code_gives_attnfts_logits_at_another_size(finetuned, base, tmp_path):
    """At 48 px on a 32 px base: a `head` adapter, whose base position embedding is resampled, not stored,
    and the `attn` run's, on the base's classes; the card's code runs where attnft cannot be imported."""
    store_dir, _ = finetuned
    store = AdapterStore(tmp_path / "store")
    torch.manual_seed(0)
    model = create_model(base, img_size=48, num_classes=5)
    report = apply_policy(model, "head")
    snapshot = BaseSnapshot.capture(model, report)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(torch.randn(4, 3, 48, 48)).pow(2).mean().backward()
    optimizer.step()
    store.save("head48", model.eval(), report, snapshot, AdapterRecord.of(model, model_name=base))
    assert not [n for n in store.read("head48").config.tensors if "position" in n]
    folders = [store.path("head48"), AdapterStore(store_dir).path("colors")]
    snippets = []
    for folder in folders:
        snippets.append(plain_card_block(folder).replace("path/to/this/folder", str(folder)))
    x = torch.randn(3, 3, 48, 48)
    with torch.no_grad():
        expected = [model(x), merged(base, store_dir, "colors")(x)]
    for got, want in zip(run_with_logits(snippets, x, tmp_path), expected):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)


def test_a_lora_adapter_loads_in_plain_peft_with_the_same_logits(base, tmp_path):
    torch.manual_seed(0)
    model, report = apply_peft_policy(create_model(base, img_size=48), "lora")
    assert sorted(report.targets.modules)[:4] == [f"vit.layers.0.attention.{p}_proj" for p in "koqv"]
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(torch.randn(4, 3, 48, 48)).pow(2).mean().backward()
    optimizer.step()
    AdapterStore(tmp_path / "store").save("lora", model.eval(), report,
                                         record=AdapterRecord.of(model, label_names=list(COLORS), model_name=base))
    folder = base.split(":", 1)[1]
    code = f"""
from peft import PeftModel
from transformers import AutoModelForImageClassification
model = PeftModel.from_pretrained(AutoModelForImageClassification.from_pretrained({folder!r}),
                                  {str(tmp_path / 'store' / 'lora')!r}).eval()
logits = lambda x: model(x, interpolate_pos_encoding=True).logits
"""
    x = torch.randn(3, 3, 48, 48)
    with torch.no_grad():
        expected = model(x)
    assert torch.allclose(plain_logits(code, x, tmp_path), expected, atol=1e-5)


def test_mixed_task_batches_equal_each_tasks_merged_model_with_the_ffn_run_once(base, tmp_path):
    store = AdapterStore(tmp_path / "store")
    for seed, classes in enumerate((3, 5)):
        torch.manual_seed(seed)
        model = create_model(base, img_size=48, num_classes=classes)
        report = apply_policy(model, "attn")
        snapshot = BaseSnapshot.capture(model, report)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        model(torch.randn(4, 3, 48, 48)).pow(2).mean().backward()
        optimizer.step()
        store.save(f"task{seed}", model.eval(), report, snapshot, AdapterRecord.of(model, model_name=base))
    served = MultiTaskModel.from_store(store, ["task0", "task1"], base_model=create_model(base, img_size=48))
    ffn_calls = []
    served.base.vit.layers[0].mlp.register_forward_hook(lambda *args: ffn_calls.append(1))
    x = torch.randn(5, 3, 48, 48)
    tasks = ["task0", "task1", "task1", "task0", "task1"]
    outputs = served(x, tasks=tasks)
    assert len(ffn_calls) == 1  # FFN once over the whole batch; attention once per task group
    for i, task in enumerate(tasks):
        with torch.no_grad():
            expected = merged(base, tmp_path / "store", task)(x[i:i + 1])[0]
        assert outputs[i].shape == expected.shape
        assert torch.allclose(outputs[i], expected, atol=1e-5)


def test_a_transformers_student_distils_from_a_teacher_through_its_logits(base, images, finetuned, tmp_path, capsys):
    """`--teacher-adapter` with a transformers base: the teacher is the stored run, served on its base, frozen."""
    store_dir, _ = finetuned
    argv = ["finetune", "--model", base, "--policy", "attn", "--res", "48", "--dataset", images, "--store",
            str(store_dir), "--output-dir", str(tmp_path / "run"), "--batch-size", "8", "--workers", "0",
            "--no-progress", "--steps", "2", "--name", "student", "--teacher-adapter", "colors",
            "--distillation", "soft"]
    assert main(argv) == 0
    assert "teacher: transformers:" in capsys.readouterr().out
    training = json.loads((store_dir / "student" / "adapter_config.json").read_text())["training"]
    assert training["distillation"]["type"] == "soft" and training["distillation"]["teacher_adapter"] == "colors"
