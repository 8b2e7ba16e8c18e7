"""Run the code a document shows, as its reader would: extract the blocks, execute them in a fresh process.

For model cards, CLI messages and README files::

    for code in python_blocks(card_text):
        result = run_isolated(code, cwd=tmp_path)          # plain timm: attnft cannot be imported
        assert result.returncode == 0, result.stderr

``run_isolated`` starts ``python -I`` (no PYTHONPATH, no user site, no script folder on the path)
with ``attnft`` made unimportable, and fails the snippet if any attnft module got loaded anyway.
``run_with_logits`` runs several snippets in one such process (starting Python and importing
torch and timm takes seconds) and returns the logits of the ``model`` each one defines.
"""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import torch

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)

# prepended to isolated code: `import attnft` raises ImportError, as where attnft is not installed
_BLOCK_ATTNFT = 'import sys\nsys.modules["attnft"] = None\n'
# appended: nothing may have reached attnft by another route
_CHECK_NO_ATTNFT = (
    '\nassert not [m for m, mod in sys.modules.items() if mod is not None and (m == "attnft" or m.startswith("attnft."))], '
    '"attnft was imported"\n'
)


def python_blocks(markdown: str) -> list[str]:
    """The code of every fenced ```python block, in order."""
    return [textwrap.dedent(block) for block in _FENCE.findall(markdown)]


def indented_block(text: str, after: str) -> str:
    """The indented lines that follow the line ending with ``after`` (how the CLI prints code), dedented."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith(after)) + 1
    block = []
    for line in lines[start:]:
        if line.strip() and not line.startswith(" "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip() + "\n"


def uses_attnft(code: str) -> bool:
    """Whether a snippet imports attnft (then it runs with attnft, not isolated)."""
    return re.search(r"^\s*(from|import)\s+attnft\b", code, re.MULTILINE) is not None


def clean_env(extra: Optional[dict] = None) -> dict:
    """The environment with offline hubs, one thread, and no PYTHONPATH."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **(extra or {}))
    env.pop("PYTHONPATH", None)
    return env


def run_isolated(code: str, cwd, env: Optional[dict] = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in ``python -I`` where attnft cannot be imported; fails (exit 1) if an attnft module was loaded."""
    return subprocess.run(
        [sys.executable, "-I", "-c", _BLOCK_ATTNFT + code + _CHECK_NO_ATTNFT],
        cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=timeout,
    )


def run_with_logits(snippets: list[str], x: torch.Tensor, cwd, *, replace: Optional[dict] = None,
                    env: Optional[dict] = None) -> list[torch.Tensor]:
    """Run each snippet (its own namespace, one isolated process) and return ``model(x)`` of the ``model`` it defines.

    ``replace`` maps placeholder text in the snippets (``path/to/this/folder``) to real values.
    """
    inputs = Path(cwd) / "snippet_inputs.pt"
    torch.save(x, inputs)
    codes = []
    for code in snippets:
        for old, new in (replace or {}).items():
            code = code.replace(old, str(new))
        codes.append(code)
    runner = f"""
import json, torch
x = torch.load({str(inputs)!r})
outputs = []
for code in {codes!r}:
    namespace = {{}}
    exec(compile(code, "<snippet>", "exec"), namespace)
    with torch.no_grad():
        outputs.append(namespace["model"](x).tolist())
print("LOGITS " + json.dumps(outputs))
"""
    result = run_isolated(runner, cwd, env)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("LOGITS "))
    return [torch.tensor(logits) for logits in json.loads(line[len("LOGITS "):])]
