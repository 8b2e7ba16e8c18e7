"""One place tells timm from transformers: ``attnft/models/build.py`` asks each library object whether a name or a
model is its own, and everything else asks the object it hands out (``library_for_name``, ``library_of``).

Only the transformers library itself (``models/hf_library.py``, and ``models/hf_models.py`` for its own private
record and prefix) reads the marks of a transformers model. This test greps the package source for the checks.
"""
import re
from pathlib import Path

import attnft

PACKAGE = Path(attnft.__file__).parent
SWITCH = "models/build.py"
TRANSFORMERS_OWN = ("models/hf_library.py", "models/hf_models.py")

Q = "[\"']"
# what -> (pattern, the modules allowed to use it)
CHECKS = {
    "asks whether a model is a transformers one": (re.compile(r"isinstance\([^)]*TimmInterface|is_transformers_"),
                                                   ("models/hf_library.py",)),
    "reads the transformers model's private record": (re.compile(r"_attnft_source"), ("models/hf_models.py",)),
    "tells a name by its transformers prefix": (re.compile(rf"startswith\(\s*(PREFIX|{Q}transformers:)"),
                                                TRANSFORMERS_OWN),
    "asks a library whether a name or a model is its own": (re.compile(r"\.claims_(name|model)\("), (SWITCH,)),
    "compares a library's name": (re.compile(rf"\.name\s*[=!]=\s*{Q}(timm|transformers){Q}"
                                             rf"|{Q}(timm|transformers){Q}\s*[=!]=\s*\w+\.name\b"), ()),
}


def _found():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for why, (pattern, allowed) in CHECKS.items():
                if pattern.search(line) and rel not in allowed:
                    yield f"attnft/{rel}:{number}: {why}: {line.strip()}"


def test_only_the_switch_tells_the_libraries_apart():
    found = list(_found())
    assert not found, "ask the model's ModelLibrary (attnft.models.library_for_name / library_of) instead:\n" + "\n".join(found)


def test_the_checks_catch_what_they_are_for():
    lines = ["if is_transformers_name(config.model_name):", "if isinstance(model, TimmInterface):",
             'model.__dict__["_attnft_source"]', 'if name.startswith("transformers:"):', "if library.claims_name(name):",
             'if library.name == "transformers":']
    for line in lines:
        assert any(pattern.search(line) for pattern, _ in CHECKS.values()), line


def test_every_name_and_model_has_one_library():
    from attnft.models import library_for_name, library_of
    from tiny_models import tiny_model

    assert library_for_name("transformers:google/vit-base-patch16-224").name == "transformers"
    assert library_for_name("vit_tiny_patch16_224").name == "timm"
    assert library_of(tiny_model("vit")).name == "timm"
