"""attnft finetune checks each thing once and carries what it found: the store and the adapter's name, the run
folder's lock, the method family. Counted on real runs by spies that call the real functions through."""
import functools
import inspect
import sys

import pytest

from attnft.adapters.store import AdapterStore
from attnft.cli import main
from attnft.methods import method_of, parse_method
from attnft.training.run_folder import RunLock
from test_runner import finetune_args, one_thread_and_private_caches, tiny  # noqa: F401  (fixtures)


def _spy(function, calls: list):
    @functools.wraps(function)
    def spy(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    return spy


def count_method(monkeypatch, owner: type, name: str) -> list:
    """The calls of ``owner.name`` (a method or a classmethod) from now on; each goes on to the real one."""
    calls: list = []
    real = inspect.getattr_static(owner, name)
    if isinstance(real, classmethod):
        monkeypatch.setattr(owner, name, classmethod(_spy(real.__func__, calls)))
    else:
        monkeypatch.setattr(owner, name, _spy(real, calls))
    return calls


def count_function(monkeypatch, function) -> list:
    """The calls of ``function`` from now on, under every name attnft's modules bind it to."""
    calls: list = []
    spy = _spy(function, calls)
    bound = [(module, attr) for module in list(sys.modules.values())
             if getattr(module, "__name__", "").startswith("attnft")
             for attr, value in list(vars(module).items()) if value is function]
    assert bound, f"no module of attnft binds {function.__name__}"
    for module, attr in bound:
        monkeypatch.setattr(module, attr, spy)
    return calls


@pytest.fixture
def counted(monkeypatch):
    """Every check the issue counted, and the look-ups of the method family."""
    import attnft.training.runner  # noqa: F401  (every module the run uses is bound before the spies go in)

    return {"check_writable": count_method(monkeypatch, AdapterStore, "check_writable"),
            "check_free": count_method(monkeypatch, RunLock, "check_free"),
            "parse_method": count_function(monkeypatch, parse_method),
            "method_of": count_function(monkeypatch, method_of)}


def _counts(counted: dict) -> dict:
    return {what: len(calls) for what, calls in counted.items()}


def test_a_named_run_checks_the_store_and_its_folder_once_and_finds_its_method_once(tiny, tmp_path, counted):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "1", "--no-eval-before", "--name", "colors")) == 0
    assert _counts(counted) == {"check_writable": 1, "check_free": 1, "parse_method": 1, "method_of": 0}
    assert (tmp_path / "store" / "colors" / "adapter_config.json").is_file()


def test_a_run_with_the_default_name_and_folder_checks_them_once_too(tiny, tmp_path, counted, monkeypatch):
    model, data = tiny
    monkeypatch.chdir(tmp_path)  # the default output dir is runs/NAME
    argv = finetune_args(model, data, tmp_path, "--steps", "1", "--no-eval-before")
    del argv[argv.index("--output-dir"):argv.index("--output-dir") + 2]
    assert main(argv) == 0
    assert _counts(counted) == {"check_writable": 1, "check_free": 1, "parse_method": 1, "method_of": 0}
    [name] = [p.name for p in (tmp_path / "store").iterdir()]
    assert (tmp_path / "runs" / name / "result.json").is_file()


def test_the_python_api_save_still_checks_by_itself(tiny, tmp_path, counted):
    """A library caller saves with AdapterStore.save alone: it refuses a taken name itself, before writing."""
    from attnft.core.errors import StoreError
    from attnft.methods.freeze.policy import apply_policy
    from attnft.methods.freeze.snapshot import BaseSnapshot
    from attnft.models import create_model

    model, _ = tiny
    vit = create_model(model)
    report = apply_policy(vit, "attn")
    store = AdapterStore(tmp_path / "store")
    base = BaseSnapshot.capture(vit, report)
    store.save("mine", vit, report, base)
    with pytest.raises(StoreError, match="an adapter named 'mine' exists"):
        store.save("mine", vit, report, base)
    assert _counts(counted)["check_writable"] == 2


def test_a_name_taken_while_the_run_trained_keeps_the_adapter_in_the_output_dir(tiny, tmp_path):
    """Checked once before training, the name is still refused at the save if something took it meanwhile (the write
    refuses an existing folder atomically): the trained adapter goes to the output dir, with the command to import it."""
    from attnft.core.errors import StoreError
    from attnft.training.config import FinetuneConfig
    from attnft.training.runner import finetune

    model, data = tiny
    store, taken = tmp_path / "store", tmp_path / "store" / "colors"

    def take_the_name(epoch, result):
        taken.mkdir(parents=True)
        (taken / "notes.txt").write_text("someone else's")

    cfg = FinetuneConfig(model=model, dataset=data, store=str(store), output_dir=str(tmp_path / "run"), name="colors",
                         epochs=2, eval_every=1, eval_before=False, batch_size=8, workers=0, progress=False, lr=2e-3,
                         warmup_epochs=0)
    with pytest.raises(StoreError, match="already exists") as refused:
        finetune(cfg, on_epoch=take_the_name)
    assert f"attnft adapters import {tmp_path / 'run' / 'colors'} colors --store {store}" in str(refused.value)
    assert [p.name for p in taken.iterdir()] == ["notes.txt"] and (tmp_path / "run" / "colors").is_dir()
