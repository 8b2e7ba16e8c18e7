"""`attnft policies`: the report as a table or JSON; user errors are one line and exit code 2."""
import json
import os
import subprocess
import sys

import pytest

from attnft.cli import main


def test_policies_json_reports_roles_and_trainable_share(capsys):
    assert main(["policies", "vit_small_patch16_224", "--policy", "attn", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    roles = {row["role"]: row for row in report["roles"]}
    assert roles["attention"]["share"] == 1.0 and roles["ffn"]["share"] == 0.0
    assert report["trainable"] == sum(row["trainable"] for row in report["roles"])
    assert 0.33 < report["trainable_share"] < 0.36


def test_policies_table_lists_every_role(capsys):
    assert main(["policies", "vit_small_patch16_18x2_224", "--policy", "ffn"]) == 0
    out = capsys.readouterr().out
    for role in ("attention", "ffn", "norm", "head", "total"):
        assert role in out


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["policies", "vit_smal_patch16"], "unknown model"),
        (["policies", "vit_small_patch16_224", "--policy", "nope"], "choose one of attn, ffn, full, head"),
        (["policies", "resnet50"], "no attention"),
    ],
)
def test_user_errors_are_one_line_exit_2_no_traceback(argv, expected):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "attnft", *argv], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0]
    assert "Traceback" not in proc.stderr
