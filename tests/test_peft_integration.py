"""peft adapters in the store, the ``adapters`` and ``policies`` commands, and multi-task serving."""
import copy
import hashlib
import json
import warnings

import pytest
import torch
from peft import PeftModel
from torch import nn

from attnft.methods.record import AdapterRecord
from attnft.methods.peft import sidecar as peft_sidecar
from attnft.core.files import CONFIG_FILE, WEIGHTS_FILE
from attnft.methods.freeze.config import AdapterConfig
from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.cli import main
from attnft.core.errors import AdapterError, StoreError, UnknownPolicyError
from attnft.multitask import MixedFamilies, MultiTaskModel
from attnft.methods.peft.sidecar import PeftAdapterInfo, is_peft_adapter
from attnft.multitask import PeftMultiTask
from attnft.methods.peft.model import apply_peft_policy
from attnft.methods.peft.spec import PEFT_METHODS
from attnft.methods.freeze.policy import Policy, apply_policy
from attnft.adapters.store import AdapterStore
from tiny_models import tiny_input, tiny_model

PEFT_TASKS = {"cars-lora": "lora:r=4,alpha=8", "pets-lora": "lora+ffn:r=2"}
ATTNFT_TASK = "flowers"


@pytest.fixture(autouse=True)
def _quiet():
    # peft warns that a timm model has no hub config; nothing to act on here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _finetune(model: nn.Module, steps: int = 3) -> None:
    """A few AdamW steps on a fixed random batch, so every trained tensor moves from its init."""
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    x, y = tiny_input(model, batch=4), torch.arange(4)
    for _ in range(steps):
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def trained():
    """One tiny ViT base with 4 classes, a fine-tuned peft model per PEFT_TASKS entry, and an attnft ``attn`` model."""
    torch.manual_seed(0)
    base = tiny_model("vit", num_classes=4).eval()
    peft_models = {}
    for i, (name, spec) in enumerate(PEFT_TASKS.items()):
        torch.manual_seed(10 + i)
        peft_model, report = apply_peft_policy(copy.deepcopy(base), spec)
        _finetune(peft_model)
        peft_models[name] = (peft_model, report)
    model = copy.deepcopy(base)
    report = apply_policy(model, "attn")
    snapshot = BaseSnapshot.capture(model, report)
    _finetune(model)
    return base, peft_models, (model, report, snapshot)


@pytest.fixture
def store(tmp_path, trained):
    """A store holding both formats: the peft adapters of PEFT_TASKS and the attnft adapter ATTNFT_TASK."""
    _, peft_models, (model, report, snapshot) = trained
    store = AdapterStore(tmp_path / "store")
    for name, (peft_model, peft_report) in peft_models.items():
        store.save(name, peft_model, peft_report, record=AdapterRecord.of(peft_model, label_names=["a", "b", "c", "d"]))
    store.save(ATTNFT_TASK, model, report, snapshot)
    return store


def logits(model, x):
    with torch.no_grad():
        return model(x)


def attnft(capsys, *argv):
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# --- the store -----------------------------------------------------------------------------------


def test_a_peft_report_is_saved_in_peft_format_with_the_sidecar(store):
    path = store.path("cars-lora")
    assert is_peft_adapter(path) and store.format_name("cars-lora") == "peft"
    assert {p.name for p in path.iterdir()} >= {CONFIG_FILE, WEIGHTS_FILE, peft_sidecar.SIDECAR_FILE}
    assert json.loads((path / CONFIG_FILE).read_text())["peft_type"] == "LORA"
    assert store.format_name(ATTNFT_TASK) == "attnft"


def test_a_peft_adapter_takes_its_fingerprint_from_its_report_not_a_base_snapshot(tmp_path, trained):
    _, peft_models, (_, _, snapshot) = trained
    peft_model, report = peft_models["cars-lora"]
    with pytest.raises(TypeError, match="no base"):
        AdapterStore(tmp_path).save("x", peft_model, report, snapshot)


def test_list_summarises_both_formats(store, trained):
    summaries = {s.name: s for s in store.list()}
    assert {name: s.mode for name, s in summaries.items()} == {"cars-lora": "peft-lora", "pets-lora": "peft-lora", ATTNFT_TASK: "exact"}
    lora = summaries["cars-lora"]
    assert lora.error is None and lora.policy == PEFT_TASKS["cars-lora"]
    assert lora.model_name.startswith("vit_small_patch16_224") and lora.num_classes == 4 and lora.input_size == 32
    assert lora.base_fingerprint == trained[1]["cars-lora"][1].base_fingerprint == summaries[ATTNFT_TASK].base_fingerprint
    assert lora.size_bytes > 0 and lora.created


def test_read_config_and_verify_of_a_peft_adapter_return_its_sidecar(store):
    for info in (store.read("cars-lora"), store.config("cars-lora"), store.verify("cars-lora")):
        assert isinstance(info, PeftAdapterInfo) and info.method == "lora" and info.label_names == ["a", "b", "c", "d"]
    assert isinstance(store.verify(ATTNFT_TASK), AdapterConfig)


def test_show_of_a_peft_adapter_is_its_sidecar_with_its_files(store):
    info = store.show("cars-lora")
    assert info["name"] == "cars-lora" and info["format"] == peft_sidecar.SIDECAR_FORMAT
    assert info["method"] == "lora" and info["head_modules"] == ["head"]
    assert set(info["targets"].values()) == {"attention"} and len(info["targets"]) == 4  # qkv, proj of 2 blocks
    assert peft_sidecar.SIDECAR_FILE in info["files"]


def test_load_returns_a_peft_model_with_the_trained_logits(store, trained):
    base, peft_models, _ = trained
    x = tiny_input(base, batch=3)
    loaded = store.load("pets-lora", copy.deepcopy(base))
    assert isinstance(loaded, PeftModel)
    expected = logits(peft_models["pets-lora"][0], x)
    assert (logits(loaded, x) - expected).abs().max() <= 1e-5
    assert (logits(base, x) - expected).abs().max() > 1e-3  # the adapter changed something


def test_import_copies_a_peft_adapter_with_its_sidecar(store, tmp_path):
    other = AdapterStore(tmp_path / "other")
    other.import_folder(store.path("cars-lora"), "imported")
    assert other.format_name("imported") == "peft" and other.verify("imported").method == "lora"


def test_import_refuses_a_broken_peft_adapter(store, tmp_path):
    (store.path("cars-lora") / WEIGHTS_FILE).write_bytes(b"broken")
    other = AdapterStore(tmp_path / "other")
    with pytest.raises(AdapterError):
        other.import_folder(store.path("cars-lora"), "imported")
    assert other.names() == []


# --- the adapters command ------------------------------------------------------------------------


def test_adapters_list_shows_both_formats(capsys, store):
    code, out, _ = attnft(capsys, "adapters", "list", "--store", str(store.root))
    assert code == 0
    rows = {row.split()[0]: row for row in out.strip().splitlines()[1:]}
    assert set(rows) == {"cars-lora", "pets-lora", ATTNFT_TASK}
    assert "peft-lora" in rows["cars-lora"] and "exact" in rows[ATTNFT_TASK]
    code, out, _ = attnft(capsys, "adapters", "list", "--store", str(store.root), "--json")
    assert {a["name"]: a["mode"] for a in json.loads(out)}["pets-lora"] == "peft-lora"


def test_adapters_verify_checks_both_formats(capsys, store):
    code, out, _ = attnft(capsys, "adapters", "verify", "--store", str(store.root))
    assert code == 0 and sorted(out.split()) == sorted(["ok", "cars-lora", "ok", "pets-lora", "ok", ATTNFT_TASK])
    code, out, _ = attnft(capsys, "adapters", "verify", "cars-lora", "--store", str(store.root), "--num-classes", "4",
                          "--policy", PEFT_TASKS["cars-lora"])
    assert code == 0 and out.strip() == "ok cars-lora"


def test_adapters_verify_reports_a_corrupted_peft_adapter_and_fails(capsys, store):
    weights = store.path("pets-lora") / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    code, out, _ = attnft(capsys, "adapters", "verify", "--store", str(store.root))
    assert code == 2
    assert "FAILED pets-lora" in out and "ok cars-lora" in out and f"ok {ATTNFT_TASK}" in out


def test_adapters_show_prints_a_peft_adapters_targets(capsys, store):
    code, out, _ = attnft(capsys, "adapters", "show", "cars-lora", "--store", str(store.root))
    assert code == 0 and "blocks.0.attn.qkv" in out and "lora" in out
    code, out, _ = attnft(capsys, "adapters", "show", "cars-lora", "--store", str(store.root), "--json")
    assert json.loads(out)["method"] == "lora"


def test_adapters_delete_removes_a_peft_adapter(capsys, store):
    code, _, _ = attnft(capsys, "adapters", "delete", "cars-lora", "--store", str(store.root))
    assert code == 0 and store.names() == sorted(["pets-lora", ATTNFT_TASK])


def test_adapters_export_of_a_peft_adapter_is_a_one_line_error(capsys, store, tmp_path):
    code, out, err = attnft(capsys, "adapters", "export", "cars-lora", "--out", str(tmp_path / "out"), "--store", str(store.root))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "peft adapter" in err
    assert not (tmp_path / "out").exists()


# --- multi-task serving --------------------------------------------------------------------------


def test_from_store_serves_peft_adapters_like_each_adapter_alone(store, trained):
    base = trained[0]
    x = tiny_input(base, batch=4)
    served = MultiTaskModel.from_store(store, list(PEFT_TASKS), base_model=copy.deepcopy(base))
    assert isinstance(served, PeftMultiTask) and served.tasks == list(PEFT_TASKS)
    alone = {name: logits(store.load(name, copy.deepcopy(base)), x) for name in PEFT_TASKS}
    for name in PEFT_TASKS:
        assert (served(x, task=name) - alone[name]).abs().max() <= 1e-5
    tasks = ["cars-lora", "pets-lora", "pets-lora", "cars-lora"]
    for i, row in enumerate(served(x, tasks=tasks)):
        assert (row - alone[tasks[i]][i]).abs().max() <= 1e-5


def test_a_peft_server_whose_every_task_was_removed_takes_new_tasks(store, trained):
    """A pager unloads the least recently used task, even a backbone's last one; peft cannot load into a
    model left without adapters, so the base is given back whole and the next task wraps it afresh."""
    base = trained[0]
    x = tiny_input(base, batch=2)
    served = MultiTaskModel.from_store(store, ["cars-lora"], base_model=copy.deepcopy(base))
    served.remove_task("cars-lora")
    assert served.tasks == []
    served.add_task("pets-lora", store.path("pets-lora"))
    served.add_task("cars-lora", store.path("cars-lora"))
    for name in PEFT_TASKS:
        assert (served(x, task=name) - logits(store.load(name, copy.deepcopy(base)), x)).abs().max() <= 1e-5


def test_a_peft_adapter_with_a_non_finite_value_is_not_served(store, trained):
    weights = store.path("cars-lora") / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"  # inf, and the sidecar's sha256 rewritten to match: only the value is off
    weights.write_bytes(bytes(data))
    sidecar = store.path("cars-lora") / peft_sidecar.SIDECAR_FILE
    info = json.loads(sidecar.read_text())
    info["weights_sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    sidecar.write_text(json.dumps(info))
    with pytest.raises(AdapterError, match="inf|finite"):
        PeftMultiTask(copy.deepcopy(trained[0])).add_task("cars", store.path("cars-lora"))


def test_from_adapters_serves_peft_folders_and_their_infos(store, trained):
    base = trained[0]
    served = MultiTaskModel.from_adapters(
        copy.deepcopy(base), {"cars": store.path("cars-lora"), "pets": store.read("pets-lora")}
    )
    assert isinstance(served, PeftMultiTask) and served.tasks == ["cars", "pets"]


def test_from_store_of_attnft_adapters_is_still_a_multitask_model(store, trained):
    served = MultiTaskModel.from_store(store, [ATTNFT_TASK], base_model=copy.deepcopy(trained[0]))
    assert isinstance(served, MultiTaskModel) and served.tasks == [ATTNFT_TASK]


def test_formats_mixed_on_one_base_are_served_in_one_call_each_sample_as_its_task_alone(store, trained):
    base = copy.deepcopy(trained[0])
    served = MultiTaskModel.from_store(store, ["cars-lora", ATTNFT_TASK], base_model=base)
    assert isinstance(served, MixedFamilies) and set(served.servers) == {"peft", "freeze"}
    assert not isinstance(base, PeftModel) and not any(isinstance(m, PeftModel) for m in base.modules())  # a copy
    x = tiny_input(base, batch=4)
    tasks = ["cars-lora", ATTNFT_TASK, ATTNFT_TASK, "cars-lora"]
    together = served(x, tasks=tasks)
    for name in ("cars-lora", ATTNFT_TASK):
        alone = MultiTaskModel.from_store(store, [name], base_model=copy.deepcopy(trained[0]))(x, task=name)
        for i in (i for i, t in enumerate(tasks) if t == name):
            torch.testing.assert_close(together[i], alone[i], atol=1e-5, rtol=0)


def test_a_peft_adapter_cannot_join_attnft_tasks(store, trained):
    served = MultiTaskModel.from_store(store, [ATTNFT_TASK], base_model=copy.deepcopy(trained[0]))
    with pytest.raises(AdapterError, match="peft adapter"):
        served.add_task("cars", store.path("cars-lora"))
    assert served.tasks == [ATTNFT_TASK]


def test_from_store_with_a_missing_name_is_a_store_error(store, trained):
    with pytest.raises(StoreError, match="nope"):
        MultiTaskModel.from_store(store, ["cars-lora", "nope"], base_model=copy.deepcopy(trained[0]))


# --- the policies command ------------------------------------------------------------------------


def test_policies_reports_what_lora_trains_as_json(capsys):
    code, out, _ = attnft(capsys, "policies", "vit_small_patch16_224", "--policy", "lora", "--json")
    report = json.loads(out)
    assert code == 0 and report["method"] == "lora" and report["policy"] == "lora"
    assert 0 < report["trainable_share"] < 0.05
    roles = {row["role"]: row for row in report["roles"]}
    assert roles["attention"]["trainable"] > 0 and roles["ffn"]["trainable"] == 0
    assert len(report["targets"]) == 24  # qkv and proj of 12 blocks


def test_policies_prints_a_table_for_ia3_and_lora_options(capsys):
    code, out, _ = attnft(capsys, "policies", "vit_small_patch16_224", "--policy", "ia3")
    assert code == 0 and "ia3 on 24 modules" in out and "total" in out
    code, out, _ = attnft(capsys, "policies", "vit_small_patch16_224", "--policy", "lora:r=16", "--json")
    assert code == 0 and json.loads(out)["options"]["r"] == 16


def test_policies_with_a_bad_peft_option_is_a_one_line_error(capsys):
    code, out, err = attnft(capsys, "policies", "vit_small_patch16_224", "--policy", "lora:rank=4")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "rank=4" in err


def test_the_unknown_policy_message_names_every_family_s_specs():
    from attnft.methods import METHODS, parse_method

    with pytest.raises(UnknownPolicyError) as error:
        parse_method("nope")
    assert "choose one of attn, ffn, full, head" in str(error.value)
    for name in [*PEFT_METHODS, *(m.name for m in METHODS.values() if m.name not in ("peft", "freeze"))]:
        assert name in str(error.value)
    with pytest.raises(UnknownPolicyError, match="choose one of attn, ffn, full, head, bitfit, ln, optionally"):
        Policy.parse("nope")  # the freezing policies alone: theirs
