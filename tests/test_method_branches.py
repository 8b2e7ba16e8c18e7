"""Nothing outside attnft/methods/ asks which method family it holds: it asks the family (attnft.methods.METHODS).

As tests/test_role_names.py does for parameter names, this greps the package: no comparison with a family's or a
peft method's name, no isinstance on a family's spec, report, config or adapter class, no reading of a config's
``method``, and no family's detection helpers called from outside."""
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attnft"
# the public path kept for saved model cards (attnft/peft_methods) only maps names to their homes
OUTSIDE = [p for p in sorted(PACKAGE.rglob("*.py")) if "methods" not in p.relative_to(PACKAGE).parts[:1]]

FAMILY_CLASSES = ("AdapterConfig", "Adapter", "PeftAdapterInfo", "PolicyReport", "PeftReport", "Policy", "PeftPolicy",
                  "FreezeTuning", "PeftTuning", "FreezeApplied", "PeftApplied")
BRANCHES = {
    "a family's or peft method's name compared": re.compile(r"""[=!]=\s*["'](?:peft|attnft|freeze|lora|ia3)["']|["'](?:peft|attnft|freeze|lora|ia3)["']\s*[=!]="""),
    "isinstance on a family's class": re.compile(r"isinstance\([^)]*\b(?:%s)\b" % "|".join(FAMILY_CLASSES)),
    "a config's method read by name": re.compile(r"""getattr\([^,]+,\s*["']method"""),
    "a family's own test called": re.compile(r"\b(?:is_peft|is_peft_adapter|is_peft_spec)\b"),
}


def test_the_grep_sees_the_whole_package_but_the_methods():
    names = {p.relative_to(PACKAGE).as_posix() for p in OUTSIDE}
    assert {"server/pager.py", "server/catalog.py", "multitask/__init__.py", "commands/adapters.py", "training/plan.py",
            "adapters/store.py"} <= names
    assert not any(name.startswith("methods/") for name in names)


def test_nothing_outside_the_methods_branches_on_the_method_family():
    found = []
    for path in OUTSIDE:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for what, pattern in BRANCHES.items():
                if pattern.search(code) and "peft_methods" not in path.parts:
                    found.append(f"{path.relative_to(PACKAGE)}:{number}: {what}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_grep_would_see_a_branch():
    samples = ['if key.format == "peft":', "if isinstance(config, PeftAdapterInfo):", 'getattr(config, "method", "")',
               "if method.is_peft and fsdp:", "return isinstance(source, Adapter)"]
    for sample in samples:
        assert any(pattern.search(sample) for pattern in BRANCHES.values()), sample
