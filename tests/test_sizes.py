"""No function of attnft over 80 lines, no module over 400 (ast, from the source)."""
import ast
from pathlib import Path

import attnft

PACKAGE = Path(attnft.__file__).parent
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), path.read_text()


def _function_lengths():
    for rel, source in _modules():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{rel}:{node.name}", node.end_lineno - node.lineno + 1


def test_no_function_is_over_80_lines():
    assert {name: n for name, n in _function_lengths() if n > MAX_FUNCTION_LINES} == {}


def test_no_module_is_over_400_lines():
    assert {rel: len(source.splitlines()) for rel, source in _modules() if len(source.splitlines()) > MAX_MODULE_LINES} == {}
