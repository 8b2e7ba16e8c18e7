"""The public API at the package root; the old path that model cards saved before name, which warns; and the old
paths gone."""
import subprocess
import sys

import pytest

import attnft
from snippets import clean_env

OLD_PATHS = {"attnft.peft_methods": "apply_peft_policy"}  # named by model cards saved before: kept while they are
GONE_PATHS = ("attnft.policy", "attnft.store", "attnft.errors")  # shims for one release, gone: from attnft import ...


def _python(code: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=clean_env(),
                          timeout=120)


def test_every_public_name_resolves_to_its_home():
    from attnft.adapters.store import AdapterStore
    from attnft.models import create_model
    from attnft.multitask import MultiTaskModel
    from attnft.methods.freeze.policy import apply_policy

    assert (attnft.create_model, attnft.apply_policy, attnft.AdapterStore, attnft.MultiTaskModel) == (
        create_model, apply_policy, AdapterStore, MultiTaskModel)
    for name in attnft.__all__:
        assert getattr(attnft, name) is not None, name
    assert set(attnft.__all__) <= set(dir(attnft))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        attnft.nope


def test_importing_attnft_imports_no_torch():
    done = _python("import sys, attnft; assert 'torch' not in sys.modules and 'timm' not in sys.modules")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("path, name", list(OLD_PATHS.items()))
def test_an_old_path_still_works_and_warns(path, name):
    done = _python(f"import warnings; warnings.simplefilter('always')\nfrom {path} import {name}\nimport attnft\n"
                   f"assert {name} is getattr(attnft, {name!r})")
    assert done.returncode == 0, done.stderr
    assert "DeprecationWarning" in done.stderr and f"{path} is deprecated" in done.stderr
    assert _python(f"import {path}", "-W", "error::DeprecationWarning").returncode != 0


@pytest.mark.parametrize("path", GONE_PATHS)
def test_the_old_shims_are_gone(path):
    done = _python(f"import {path}")
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr


def test_model_cards_name_the_new_paths():
    import inspect

    from attnft.methods import cards
    from attnft.methods.freeze import card as freeze_card
    from attnft.methods.peft import card as peft_card
    from attnft.models import hf_library

    for module in (cards, freeze_card, peft_card, hf_library):
        source = inspect.getsource(module)
        assert "from attnft import" in source or module is cards  # an export's card needs no attnft
        assert not [path for path in (*OLD_PATHS, *GONE_PATHS) if f"from {path} import" in source]
