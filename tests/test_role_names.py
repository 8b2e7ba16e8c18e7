"""Only the role map reads parameter and module names: no other module of attnft matches them.

The role map (``attnft/roles/``: ``map.py``, ``walk.py``, ``names.py`` and the family tables in ``families/``) may;
every other module asks a :class:`attnft.roles.RoleMap` (``module_role``, ``claiming_module``, ``block_path``, ``head_of``,
``is_bias``, ``is_grid_sized``, ``top_level``) or the name helpers of ``attnft.roles``
(``split_first``, ``split_last``, ``module_of``, ``join_name``, ``is_under``, ``is_weight``,
``is_method_tensor``). This test greps the package source for the ways names get matched.
"""
import re
from pathlib import Path

import attnft

PACKAGE = Path(attnft.__file__).parent
ROLE_MAP = "roles/"  # the role map and its family tables

Q = "[\"']"
PATTERNS = {
    "splits a dotted name": re.compile(rf"\.r?(split|partition)\(\s*f?{Q}\.{Q}"),
    "matches a name's ending": re.compile(rf"\.(endswith|startswith)\(\s*f?{Q}\.?(bias|weight|gamma|lambda)"),
    "compares with a module or tensor name": re.compile(
        rf"[=!]=\s*{Q}(head|head_dist|fc_norm|pos_embed|cls_token|dist_token|patch_embed|classifier){Q}"
        rf"|\bin\s+[(\[{{]\s*{Q}(head|pos_embed|cls_token|patch_embed){Q}"),
    "uses a name table of the role map": re.compile(
        r"\b(HEAD_NAMES|GRID_SIZED_TABLES|_CLASSIFIER_MODULES|POS_EMBED_CLASSES|TOKEN_NAMES|ATTENTION_CLASSES"
        r"|FFN_CLASSES|PATCH_EMBED_CLASSES|FUSED_BLOCK_CLASSES)\b"),
    "matches peft's tensor names": re.compile(rf"{Q}[^\"']*(\.ia3_l\b|lora_\[)"),
}

# path -> line fragments that match a pattern but are allowed, each with why
ALLOWED = {
    # not parameter names
    "models/plain_timm.py": ['module.split(".")[0] == "timm"'],  # a Python module's package
}


def _matches():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(ROLE_MAP):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for why, pattern in PATTERNS.items():
                if pattern.search(line):
                    yield rel, number, line.strip(), why


def test_no_module_but_the_role_map_matches_parameter_or_module_names():
    found = [
        f"attnft/{rel}:{number}: {why}: {line}"
        for rel, number, line, why in _matches()
        if not any(fragment in line for fragment in ALLOWED.get(rel, ()))
    ]
    assert not found, "ask attnft.roles instead:\n" + "\n".join(found)


def test_the_patterns_catch_what_they_are_for():
    lines = ['top = name.split(".", 1)[0]', 'owner, _, leaf = key.rpartition(".")', 'if name.endswith(".bias"):',
             'if attr == "head":', "if n in HEAD_NAMES:", 'scale = ".ia3_l." in name']
    for line in lines:
        assert any(p.search(line) for p in PATTERNS.values()), line
    assert not any(p.search('text.split(". ")[0]') for p in PATTERNS.values())
