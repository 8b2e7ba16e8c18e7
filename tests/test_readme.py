"""The README is what a newcomer reads first: at most 150 lines, its two commands as they always were, every Python
snippet of it running in a fresh process (tests/doc_snippets.py), and the test command the one CI runs verbatim."""
from pathlib import Path

from doc_snippets import python_blocks_with_markers, run_block, shortened

README = Path(__file__).resolve().parents[1] / "README.md"
# the two commands a fresh clone runs: set up and run the main job; set up and run the tests
MAIN_JOB = "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && attnft finetune --policy attn --res 384"
TESTS = ("python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[test]' && HF_HUB_OFFLINE=1 "
         "HF_DATASETS_OFFLINE=1 python -m pytest -q tests")


def test_the_readme_is_at_most_150_lines_and_keeps_its_two_commands_unchanged():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    assert MAIN_JOB in lines and TESTS in lines


def test_every_python_snippet_of_the_readme_runs(tmp_path):
    blocks = python_blocks_with_markers(README.read_text(), "README.md")
    assert blocks
    for block in blocks:
        code = shortened(block.code) if "shortened" in block.markers else block.code
        done = run_block(code, tmp_path)
        assert done.returncode == 0, f"README snippet failed:\n{code}\n{done.stderr[-2000:]}"


def test_ci_runs_the_readmes_test_command_verbatim():
    commands = [line for line in README.read_text().splitlines() if "python -m pytest" in line]
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert commands and commands[0].strip() in [line.strip() for line in ci]
