"""The field's methods as families of their own: VPT, AdaptFormer and SSF (each a package and one registration),
BitFit and LayerNorm tuning (named freezing policies). What they train, counted; trained and stored, evaluated,
served many to a base in one call; SSF merged into a plain timm checkpoint; bad input refused in one line."""
import json
import math
import re
import tokenize
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file

from attnft.adapters.store import AdapterStore
from attnft.cli import main
from attnft.core.files import CONFIG_FILE
from attnft.data import build_transforms, decode_image
from attnft.models import create_model
from attnft.multitask import MixedFamilies, MultiTaskModel
from serve_helpers import Server
from test_runner import _fails_cleanly, eval_as_run_reported, finetune_args, write_color_folder, write_tiny_model

PACKAGE = Path(__file__).resolve().parents[1] / "attnft"
NEW_FAMILIES = ("vpt", "adaptformer", "ssf")


def _policies_json(capsys, model, policy) -> dict:
    capsys.readouterr()
    assert main(["policies", model, "--policy", policy, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("policy, added", [
    ("vpt:tokens=10", 12 * 10 * 768),  # 92,160 prompt weights
    ("vpt:tokens=50,deep=false", 50 * 768),
    ("adaptformer:dim=64", 12 * (768 * 64 + 64 + 64 * 768 + 768)),  # 1,189,632
    ("ssf", 2 * (768 + 12 * (3 * 768 + 768 + 4 * 768 + 768 + 2 * 768) + 768)),  # patch proj, 4 linears, 2 norms, norm
])
def test_policies_counts_what_each_method_adds_and_the_head(capsys, policy, added):
    report = _policies_json(capsys, "vit_base_patch16_224", policy)
    assert report["added_params"] == added
    assert report["trainable"] == added + 768 * 1000 + 1000  # and the head, trained whole


def test_bitfit_and_ln_train_what_the_field_calls_them(capsys):
    bitfit = {row["role"]: row for row in _policies_json(capsys, "vit_base_patch16_224", "bitfit")["roles"]}
    ln = {row["role"]: row for row in _policies_json(capsys, "vit_base_patch16_224", "ln")["roles"]}
    assert bitfit["head"]["share"] == 1.0 and 0 < bitfit["attention"]["share"] < 0.01 and bitfit["norm"]["share"] == 0.5
    assert ln["norm"]["share"] == 1.0 and ln["head"]["share"] == 1.0 and ln["attention"]["share"] == 0.0


@pytest.mark.parametrize("spec, words", [
    ("vpt:tokens=0", ["tokens must be a positive integer"]),
    ("adaptformer:dim=-1", ["dim must be a positive integer"]),
    ("vpt:depth=3", ["unknown option 'depth=3'"]),
    ("ssf@0-3", ["ssf takes no @BLOCKS"]),
])
def test_bad_specs_are_one_line_exit_2_and_write_nothing(capsys, tmp_path, spec, words):
    argv = finetune_args("vit_fmnist_patch4_28", "fashion-mnist", tmp_path, "--policy", spec)
    _fails_cleanly(capsys, argv, words=words, untouched=[tmp_path])
    assert not (tmp_path / "store").exists() and not (tmp_path / "run").exists()


def test_a_method_on_a_model_it_cannot_adapt_is_refused_naming_what_it_can(capsys):
    capsys.readouterr()
    assert main(["policies", "swin_tiny_patch4_window7_224", "--policy", "ssf"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "VisionTransformer" in err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model, its colour folder, and a store holding an attn adapter and one of each new family."""
    tmp = tmp_path_factory.mktemp("field")
    model, data = write_tiny_model(tmp / "model"), write_color_folder(tmp / "colors")
    for policy in ("attn", "vpt:tokens=4", "adaptformer:dim=8", "ssf"):
        name = policy.split(":")[0]
        assert main(finetune_args(model, data, tmp, "--policy", policy, "--steps", "3", "--name", name,
                                  "--output-dir", str(tmp / f"run-{name}"))) == 0
    return model, data, tmp


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_each_new_family_trains_saves_verifies_and_evaluates(trained, family):
    _, data, tmp = trained
    store = AdapterStore(tmp / "store")
    assert json.loads((store.path(family) / CONFIG_FILE).read_text())["format"] == f"attnft-{family}-adapter"
    assert main(["adapters", "verify", family, "--store", str(store.root)]) == 0
    (tmp / "eval.json").unlink(missing_ok=True)  # the previous family's
    eval_as_run_reported(tmp, data, json.loads((tmp / f"run-{family}" / "result.json").read_text()), name=family)


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_each_new_family_trains_in_bf16_and_keeps_float32_weights(trained, tmp_path, family):
    """bf16 autocast (``--precision bf16``, as on an accelerator): the added tensors train in float32 (autocast casts
    their uses, not them), the loss stays finite and the adapter stored is float32, loadable as any other."""
    model, data, _ = trained
    assert main(finetune_args(model, data, tmp_path, "--policy", family, "--steps", "3", "--precision", "bf16",
                              "--no-eval-before", "--log-every", "1", "--name", "half")) == 0
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert len(losses) == 3 and all(map(math.isfinite, losses))
    store = AdapterStore(tmp_path / "store")
    stored = load_file(str(store.path("half") / "adapter_model.safetensors"))
    added = {k: v for k, v in stored.items() if not k.startswith("head.")}
    assert added and all(v.dtype == torch.float32 for v in added.values())
    loaded = store.load("half", create_model(model, pretrained=True)).state_dict()
    for key, value in added.items():
        torch.testing.assert_close(loaded[key], value, atol=0, rtol=0)


def test_a_mixed_batch_of_new_families_and_attn_equals_each_task_alone(trained):
    model, _, tmp = trained
    store = AdapterStore(tmp / "store")
    names = ["attn", *NEW_FAMILIES]
    mixed = MultiTaskModel.from_store(store, names, base_model=create_model(model, pretrained=True))
    assert isinstance(mixed, MixedFamilies) and set(mixed.servers) == {"freeze", *NEW_FAMILIES}
    x = torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tasks = [names[i % 4] for i in range(8)]
    together = mixed(x, tasks=tasks)
    for name in names:
        plain = store.load(name, create_model(model, pretrained=True)).eval()  # the model as trained, alone
        with torch.no_grad():
            expected = plain(x)
        for i in (i for i, t in enumerate(tasks) if t == name):
            torch.testing.assert_close(together[i], expected[i], atol=1e-5, rtol=0)


def test_two_tasks_of_one_family_share_one_batched_call(trained, tmp_path):
    model, data, tmp = trained
    store = AdapterStore(tmp / "store")
    assert main(finetune_args(model, data, tmp_path, "--policy", "ssf", "--steps", "2", "--seed", "1",
                              "--store", str(store.root), "--name", "ssf-b")) == 0
    server = MultiTaskModel.from_store(store, ["ssf", "ssf-b"], base_model=create_model(model, pretrained=True))
    assert type(server).__name__ == "AddedServer"
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    together = server(x, tasks=["ssf", "ssf-b", "ssf-b", "ssf"])
    for i, name in enumerate(["ssf", "ssf-b", "ssf-b", "ssf"]):
        torch.testing.assert_close(together[i], server(x[i:i + 1], task=name)[0], atol=1e-5, rtol=0)


def test_an_ssf_adapter_exports_to_a_plain_timm_checkpoint_with_the_same_logits(trained, capsys):
    model, _, tmp = trained
    store = AdapterStore(tmp / "store")
    assert main(["adapters", "export", "ssf", "--store", str(store.root), "--out", str(tmp / "ssf-export")]) == 0
    exported = timm.create_model(f"local-dir:{tmp / 'ssf-export'}", pretrained=True).eval()
    assert not any("ssf_" in name for name in exported.state_dict())
    adapted = store.load("ssf", create_model(model, pretrained=True)).eval()
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(exported(x), adapted(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["vpt", "adaptformer"])
def test_vpt_and_adaptformer_refuse_export_in_one_line(trained, capsys, family):
    _, _, tmp = trained
    _fails_cleanly(capsys, ["adapters", "export", family, "--store", str(tmp / "store"), "--out",
                            str(tmp / f"{family}-export")], words=[f"{family} adapter", "cannot be merged"],
                   untouched=[tmp / "store"])
    assert not (tmp / f"{family}-export").exists()


def _offline_probabilities(store, model, task, images) -> list[torch.Tensor]:
    """What the stored ``task`` answers for each image file, in float32 and in this process, as served alone."""
    config = store.config(task)
    transform = build_transforms(dict(config.data_config), train=False)
    x = torch.stack([transform(decode_image(path.read_bytes())) for path in images])
    served = MultiTaskModel.from_store(store, [task], base_model=create_model(model, pretrained=True))
    with torch.no_grad():
        return list(torch.softmax(served(x, task=task), dim=-1))


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_attnft_serve_serves_attn_and_vpt_tasks_of_one_base_from_one_process(trained, precision):
    """Every family's tasks from one process, at full and at half precision (the added tensors cast with the base):
    the answers' top-1 are fp32's, computed offline, on images fp32 is sure of."""
    model, data, tmp = trained
    images = sorted(Path(data, "val").glob("*/*"))
    store = AdapterStore(tmp / "store")
    with Server(store, tmp, "--precision", precision) as server:
        answers = {task: [server.classify(task, path.read_bytes(), top_k=1) for path in images]
                   for task in ("attn", "vpt", "ssf", "adaptformer")}
    for task, answered in answers.items():
        assert all(a.status_code == 200 and a.json()["task"] == task for a in answered), answered[0].text
        expected = _offline_probabilities(store, model, task, images)
        sure = [i for i, p in enumerate(expected) if p.topk(2).values.diff().abs() > 0.02]
        assert sure and all(answered[i].json()["predictions"][0]["index"] == int(expected[i].argmax()) for i in sure)


def _names_a_family(path: Path) -> list[int]:
    """Lines of ``path`` whose code (not its comments or prose) names a new family: an identifier (an import of its
    package, a class) or a string that is its name or spec."""
    family = re.compile(r"(?i)^(?:vpt|adaptformer|ssf)$")
    spec = re.compile(r"""(?i)^[rbuf]*["'](?:vpt|adaptformer|ssf)(?:[:@"']|$)""")
    with open(path, "rb") as f:
        tokens = list(tokenize.tokenize(f.readline))
    return sorted({t.start[0] for t in tokens
                   if (t.type == tokenize.NAME and family.match(t.string))
                   or (t.type == tokenize.STRING and spec.match(t.string))})


def test_no_file_of_attnft_but_its_package_names_a_new_family():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if parts[:2] in {("methods", family) for family in NEW_FAMILIES} or parts == ("methods", "__init__.py"):
            continue  # its own package, and the one line that imports the built-in families
        found += [f"{path.relative_to(PACKAGE)}:{line}" for line in _names_a_family(path)]
    assert not found, found


def test_the_family_grep_would_see_a_name(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('from .vpt import VPT\nif spec == "ssf":\n    pass\nx = "adaptformer:dim=8"  # vpt\n')
    assert _names_a_family(sample) == [1, 2, 4]
