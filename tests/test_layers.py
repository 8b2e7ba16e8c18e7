"""The package is built in layers, and the layers are a contract: import-linter's contracts in setup.cfg hold
(every package imports only those below it, no circle), and the documentation's Layout page
(docs/developer/layout.md) names every package and every module there is."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnft

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(attnft.__file__).parent


def lint_imports() -> str:
    beside = Path(sys.executable).with_name("lint-imports")
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail("import-linter is a test dependency and is not installed: pip install -e '.[test]'")
    return found


def test_lint_imports_keeps_every_contract_of_setup_cfg():
    done = subprocess.run([lint_imports(), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout or " broken" not in done.stdout


def _packages() -> set[str]:
    return {p.parent.name for p in PACKAGE.glob("*/__init__.py")} - {"peft_methods"}  # a public path, not a layer


LAYOUT_PAGE = REPO / "docs" / "developer" / "layout.md"


def _layout() -> str:
    """The page's list of packages, bottom to top."""
    page = LAYOUT_PAGE.read_text()
    return page.split("## The packages, bottom to top", 1)[1].split("\n## ", 1)[0]


def test_the_layout_page_names_every_package_of_attnft_and_no_other():
    named = set(re.findall(r"^- \*\*`(\w+)/`\*\*", _layout(), flags=re.M))
    assert named == _packages()


def test_the_layout_page_names_every_module_of_each_package():
    layout = _layout()
    missing = [f"{p.parent.name}/{p.name}" for p in sorted(PACKAGE.glob("*/*.py"))
               if p.name != "__init__.py" and p.parent.name not in ("peft_methods",) and f"`{p.name}`" not in layout]
    assert not missing, f"{LAYOUT_PAGE.relative_to(REPO)} does not name: {missing}"
