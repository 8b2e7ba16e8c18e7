"""The Python blocks of README.md and docs/, as their readers would run them.

A block runs in a fresh process. An HTML comment right before its fence says what else it needs
(``<!-- snippet: store -->``; the words are :data:`MARKERS`): without one it runs as it is, in an empty folder.
``--8<-- "path"`` lines (pymdownx.snippets, which the site uses to show a repository file) are replaced by the file,
so a block shows and runs the same code. A block that does not import attnft runs where attnft cannot be imported
(:func:`snippets.run_isolated`).
"""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from snippets import clean_env, run_isolated, uses_attnft

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

# what a marker may ask for (tests/test_docs_snippets.py provides each)
MARKERS = {
    "store": "a folder whose adapters/ holds the adapters the pages name, and exported/ an export",
    "server": "attnft serve running on that store, its URL for http://127.0.0.1:8000",
    "repo": "the repository's root as the working folder",
    "shortened": "FinetuneConfig(...) given a step on a few images (the same code path, in seconds)",
    "stand-in": "data or a model we cannot ship replaced by a local stand-in of the same layout",
}
# FinetuneConfig's fields a shortened block gets, unless it sets them itself
SHORTENED = {"steps": 1, "batch_size": 2, "max_train": 16, "max_eval": 16, "workers": 0, "progress": False,
             "eval_before": False}

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_MARKER = re.compile(r"<!--\s*snippet:\s*([^>]*?)\s*-->\s*$")
_INCLUDE = re.compile(r'^--8<--\s+"([^"]+)"\s*$', re.MULTILINE)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    index: int  # its place among the page's Python blocks
    markers: frozenset[str]
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}#{self.index}"


def python_blocks_with_markers(markdown: str, page: str) -> list[Block]:
    """Every fenced ```python block of ``markdown``, its markers, its includes resolved."""
    blocks = []
    for index, match in enumerate(_FENCE.finditer(markdown)):
        before = markdown[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.match(before.strip())
        markers = frozenset(marker.group(1).split()) if marker else frozenset()
        unknown = markers - set(MARKERS)
        assert not unknown, f"{page}: unknown snippet marker(s) {sorted(unknown)}; known: {sorted(MARKERS)}"
        blocks.append(Block(page, index, markers, resolve_includes(match.group(1))))
    return blocks


def resolve_includes(code: str) -> str:
    """``--8<-- "path"`` lines replaced by the repository file they name."""
    return _INCLUDE.sub(lambda m: (REPO / m.group(1)).read_text().rstrip("\n"), code)


def doc_blocks() -> list[Block]:
    """The Python blocks of every page under docs/, in page order."""
    blocks = []
    for path in sorted(DOCS.rglob("*.md")):
        blocks += python_blocks_with_markers(path.read_text(), str(path.relative_to(REPO)))
    return blocks


def shortened(code: str) -> str:
    """``code`` with :data:`SHORTENED` given to each ``FinetuneConfig(`` call (those it does not set itself)."""
    extra = ", ".join(f"{name}={value!r}" for name, value in SHORTENED.items() if f"{name}=" not in code)
    assert "FinetuneConfig(" in code, "a shortened snippet calls FinetuneConfig(...)"
    return code.replace("FinetuneConfig(", f"FinetuneConfig({extra}, ")


def with_stand_ins(code: str, stand_ins: dict[str, str]) -> str:
    """``code`` with each stand-in's text replaced; at least one must occur."""
    used = [old for old in stand_ins if old in code]
    assert used, f"a stand-in snippet names none of {sorted(stand_ins)}"
    for old in used:
        code = code.replace(old, stand_ins[old])
    return code


def run_block(code: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh process in ``cwd``: with attnft as installed (and nothing of the tests) when it imports
    attnft, else where attnft cannot be imported at all."""
    env = clean_env({"PYTHONPATH": str(REPO)})
    if not uses_attnft(code):
        return run_isolated(code, cwd, env=clean_env(), timeout=timeout)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
