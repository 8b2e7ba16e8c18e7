"""The reference pages hold what the code holds: every command and flag of the parsers is on the generated CLI page;
every name of attnft.__all__ has an entry in the Python reference, with its parameters documented; every refusal of
the server is on the HTTP page; the method pages and the serving tutorial quote the code's defaults and the results'
figures."""
import argparse
import ast
import importlib
import importlib.util
import inspect
import json
import re
import types
from pathlib import Path

import pytest

import attnft
from attnft.cli import build_parser
from attnft.methods import parse_method

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _generator(name: str):
    """A page generator of docs/gen/ as a module (its functions; the page is written only under mkdocs-gen-files)."""
    spec = importlib.util.spec_from_file_location(f"docs_gen_{name}", DOCS / "gen" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands(parser: argparse.ArgumentParser, path=("attnft",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, path + (name,))


def test_every_command_and_flag_of_the_parsers_is_on_the_cli_page():
    page = _generator("cli_reference").render(build_parser())
    commands = list(_commands(build_parser()))
    assert len(commands) >= 14  # attnft, its 6 commands, the 8 actions of adapters
    for path, parser in commands:
        assert f"`{' '.join(path)}` {{#{'-'.join(path)}}}" in page, f"no section for {' '.join(path)}"
        section = page.split(f"{{#{'-'.join(path)}}}", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            for name in action.option_strings or [action.dest]:
                assert f"`{name}`" in section, f"{' '.join(path)}: {name} is not on the CLI page"


def _reference_entries() -> set[str]:
    return {m for page in (DOCS / "reference" / "python").glob("*.md")
            for m in re.findall(r"^::: ([\w.]+)$", page.read_text(), flags=re.M)}


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _public(name: str):
    """What ``from attnft import name`` is, a callable package (``attnft.compare``, once imported) as its function."""
    value = getattr(attnft, name)
    return getattr(value, name) if isinstance(value, types.ModuleType) and callable(value) else value


def test_every_public_name_has_an_entry_in_the_python_reference():
    """A ``::: home.name`` entry whose object is the one ``from attnft import name`` gives."""
    found = set()
    for dotted in _reference_entries():
        name = dotted.rsplit(".", 1)[1]
        if name in attnft.__all__ and _resolve(dotted) is _public(name):
            found.add(name)
    assert sorted(set(attnft.__all__) - found) == []


def _documented(doc: str, section: str) -> set[str]:
    """The names a Google-style section (``Args:``, ``Attributes:``) of ``doc`` documents."""
    if f"{section}:" not in doc:
        return set()
    body = doc.split(f"{section}:", 1)[1]
    return set(re.findall(r"^    (\*{0,2}\w+)(?: \([^)]*\))?:", body.split("\n\n")[0] + "\n", flags=re.M))


PUBLIC_CALLABLES = [n for n in attnft.__all__ if inspect.isfunction(_public(n))]


@pytest.mark.parametrize("name", PUBLIC_CALLABLES)
def test_every_public_functions_parameters_are_documented(name):
    function = _public(name)
    doc = inspect.getdoc(function) or ""
    parameters = {("**" if p.kind is p.VAR_KEYWORD else "") + p.name
                  for p in inspect.signature(function).parameters.values()}
    assert parameters <= _documented(doc, "Args"), f"{name}: Args lacks {parameters - _documented(doc, 'Args')}"
    assert "Returns:" in doc or inspect.signature(function).return_annotation in (None, "None")


CLASSES_WITH_ARGS = ["AdapterStore", "MultiTaskModel", "PeftMultiTask"]
RECORDS = ["Policy", "PolicyReport", "AdapterRecord", "BaseSnapshot"]


@pytest.mark.parametrize("name", CLASSES_WITH_ARGS)
def test_the_public_classes_document_what_they_are_built_from(name):
    cls = getattr(attnft, name)
    parameters = set(inspect.signature(cls.__init__).parameters) - {"self"}
    assert parameters <= _documented(inspect.getdoc(cls), "Args")


@pytest.mark.parametrize("name", RECORDS)
def test_the_public_records_document_their_fields(name):
    import dataclasses

    cls = getattr(attnft, name)
    fields = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    assert fields <= _documented(inspect.getdoc(cls), "Attributes")


def test_every_field_of_the_public_configs_is_on_the_generated_config_page():
    import dataclasses

    page = _generator("config_reference").config_page()
    for cls in (attnft.FinetuneConfig, attnft.CompareConfig):
        for field in dataclasses.fields(cls):
            assert f"| `{field.name}` | `--{field.name.replace('_', '-')}` |" in page


def test_the_method_registry_has_its_docstring():
    source = (REPO / "attnft" / "methods" / "registry.py").read_text()
    body = ast.parse(source).body
    at = next(i for i, node in enumerate(body) if isinstance(node, ast.AnnAssign) and node.target.id == "METHODS")
    assert isinstance(body[at + 1], ast.Expr) and isinstance(body[at + 1].value.value, str)


def _refusals() -> set[tuple[int, str]]:
    found = set()
    for path in (REPO / "attnft" / "server").glob("*.py"):
        source = path.read_text()
        found |= {(int(s), k) for s, k in re.findall(r'RequestError\((\d{3}), "(\w+)"', source)}
        found |= {(int(s), k) for s, k in re.findall(r'status=(\d{3}), kind="(\w+)"', source)}
    return found


def test_every_refusal_of_the_server_is_on_the_http_page():
    page = (DOCS / "reference" / "http.md").read_text()
    refusals = _refusals()
    assert len(refusals) >= 15
    missing = sorted(r for r in refusals if f"| {r[0]} | `{r[1]}` |" not in page)
    assert not missing, f"docs/reference/http.md lacks {missing}"


def test_the_serving_sizing_note_quotes_the_benchmarks_figures():
    results = json.loads((REPO / "benchmarks" / "results" / "serve.json").read_text())
    page = (DOCS / "tutorials" / "serve.md").read_text()
    top = max(results["levels"])
    for row in results["throughput"]:
        if row["clients"] == top and row["max_batch"] == results["max_batch"]:
            assert f"{row['requests_per_s']:.1f} requests/s at p99 {row['p99_ms']:.1f} ms" in page, row["client"]


METHOD_PAGES = {"attn": "attn", "ffn": "ffn", "full": "full", "head": "head", "bitfit": "bitfit", "ln": "ln",
                "lora": "lora", "ia3": "ia3", "vpt": "vpt", "adaptformer": "adaptformer", "ssf": "ssf"}


@pytest.mark.parametrize("spec", METHOD_PAGES)
def test_each_method_page_states_the_methods_default_learning_rate_and_warmup(spec):
    page = (DOCS / "concepts" / "methods" / f"{METHOD_PAGES[spec]}.md").read_text()
    defaults = parse_method(spec).defaults
    mantissa, exponent = f"{defaults.lr:.1e}".split("e")  # 1.5e-02 -> 1.5e-2, 2.0e-02 -> 2e-2
    assert f"lr {mantissa.removesuffix('.0')}e{int(exponent)} at batch {defaults.base_batch}" in page
    warmup = f"warmup over {defaults.warmup:.0%} of the run" if defaults.warmup else "no warmup"
    assert warmup in page
