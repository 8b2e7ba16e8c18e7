"""No function of attnft over 80 lines, no module over 400 (ast, from the source).

The ones still over are listed, each with its size when the limit came in: the list may only shrink (a test
fails when one of them is back within the limit, so that it leaves the list), and nothing new joins it.
"""
import ast
from pathlib import Path

import attnft

PACKAGE = Path(attnft.__file__).parent
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400

# still over the limits (issue 20, "the run in phases"): to split, not to grow
KNOWN_LONG_FUNCTIONS = {
    "training/runner.py:_finetune": 297,
}
KNOWN_LONG_MODULES = {
    "training/runner.py": 472,
    "training/config.py": 441,
    "roles/map.py": 444,
    "tuning/memory.py": 412,
}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), path.read_text()


def _function_lengths():
    for rel, source in _modules():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{rel}:{node.name}", node.end_lineno - node.lineno + 1


def test_no_function_is_over_80_lines_but_the_known_ones_which_do_not_grow():
    long = {name: n for name, n in _function_lengths() if n > MAX_FUNCTION_LINES}
    assert {k: v for k, v in long.items() if k not in KNOWN_LONG_FUNCTIONS or v > KNOWN_LONG_FUNCTIONS[k]} == {}
    assert set(KNOWN_LONG_FUNCTIONS) <= set(long), "now within the limit: remove it from KNOWN_LONG_FUNCTIONS"


def test_no_module_is_over_400_lines_but_the_known_ones_which_do_not_grow():
    long = {rel: len(source.splitlines()) for rel, source in _modules() if len(source.splitlines()) > MAX_MODULE_LINES}
    assert {k: v for k, v in long.items() if k not in KNOWN_LONG_MODULES or v > KNOWN_LONG_MODULES[k]} == {}
    assert set(KNOWN_LONG_MODULES) <= set(long), "now within the limit: remove it from KNOWN_LONG_MODULES"
