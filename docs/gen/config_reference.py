"""reference/config.md and reference/method-defaults.md, generated at build time from the code: every field of the
config dataclasses (a recipe's keys and the flags' names) with its type, default and help, and every method's
learning rate, warmup and their source from the registry. Run by mkdocs-gen-files."""
from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).parent))

from cli_reference import text  # noqa: E402  (the same escaping as the CLI page)

CONFIG_PAGE = "reference/config.md"
DEFAULTS_PAGE = "reference/method-defaults.md"
DATASETS_PAGE = "reference/datasets.md"

CONFIG_INTRO = """\
# Recipe and config fields

Generated from the config dataclasses when the site is built. A field is a recipe key (YAML, `field: value`) and a
flag (`--field-name`); the command line overrides the recipe, the recipe overrides the default. In Python the same
names are the dataclasses' keyword arguments: `FinetuneConfig(policy="lora", res=384)`. Each value is checked when
the dataclass is built, before anything runs (a `ConfigError` naming the field).

A recipe (`recipes/vit_s_224_to_384_attn.yaml`, cut):

```yaml
--8<-- "recipes/vit_s_224_to_384_attn.yaml:11:22"
```
"""

# (class, its module, what it configures, the command that takes it)
CONFIGS = (
    ("FinetuneConfig", "attnft.training.config", "One fine-tuning run", "attnft finetune"),
    ("EvalConfig", "attnft.training.config", "One evaluation", "attnft eval"),
    ("CompareConfig", "attnft.compare.config", "What only a comparison has (it takes FinetuneConfig's fields but "
     "policy, lr, weight_decay, seed, output_dir, name, resume, search_holdout, eval_every, checkpoint_every and "
     "overwrite, which it sets per run)", "attnft compare"),
    ("ServeConfig", "attnft.server.config", "The HTTP server", "attnft serve"),
)


def type_text(hint) -> str:
    """``Optional[int]`` -> ``int or none``; ``tuple[float, float]`` -> ``float float``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        kinds = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(kinds) + (" or none" if type(None) in args else "")
    if typing.get_origin(hint) is tuple:
        return " ".join(type_text(a) for a in args)
    return getattr(hint, "__name__", str(hint))


def default_text(field: dataclasses.Field) -> str:
    from attnft.core.parsing import TASK_DEFAULT

    if field.default is dataclasses.MISSING:
        return "" if field.default_factory is dataclasses.MISSING else repr(field.default_factory())
    if field.default is TASK_DEFAULT:
        return "the demo's without --dataset, else all"
    if field.default is None:
        return "none"
    if isinstance(field.default, tuple):
        return " ".join(map(str, field.default))
    return str(field.default).lower() if isinstance(field.default, bool) else str(field.default)


def config_section(name: str, module: str, what: str, command: str) -> str:
    import importlib

    cls = getattr(importlib.import_module(module), name)
    hints = typing.get_type_hints(cls)
    lines = [f"## {name}", "", f"{what}: `{command}`'s flags, `{module}.{name}` in Python.", ""]
    groups: dict[str, list[str]] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        help_text = field.metadata.get("help", "")
        choices = field.metadata.get("choices")
        if choices:
            help_text += f" (one of {', '.join(map(str, choices))})"
        row = (f"| `{field.name}` | `--{field.name.replace('_', '-')}` | {text(type_text(hints[field.name]))} | "
               f"{text(default_text(field))} | {text(help_text)} |")
        groups.setdefault(field.metadata.get("group") or "options", []).append(row)
    for group, rows in groups.items():
        lines += [f"**{text(group)}**", "", "| key | flag | type | default | what it sets |", "|---|---|---|---|---|",
                  *rows, ""]
    return "\n".join(lines)


def config_page() -> str:
    return "\n".join([CONFIG_INTRO, *(config_section(*config) for config in CONFIGS)])


DEFAULTS_INTRO = """\
# Method defaults

Generated from the method registry when the site is built: the learning rate and warmup each method trains at
unless `--lr` / `--warmup-epochs` (or a recipe's `lr` / `warmup_epochs`) say otherwise, and where each came from.
The rate is stated at a global batch of 64 and scaled with the global batch (`lr x batch / 64`); the warmup is a
share of the run. An edited policy trains at its base's (`attn+norm` as `attn`, `head+bias` as `head`).
[How they were chosen](../concepts/defaults.md).

| spec | family | lr at batch 64 | warmup | source |
|---|---|---:|---:|---|
"""

SPECS = ("attn", "ffn", "full", "head", "bitfit", "ln", "lora", "lora:dora=true", "ia3", "vpt", "adaptformer", "ssf")


def short_float(value: float) -> str:
    """5e-4, not 5e-04: as the pages and the code write rates."""
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def defaults_page() -> str:
    from attnft.methods import METHODS, parse_method

    rows = []
    for spec in SPECS:
        tuning = parse_method(spec)
        defaults = tuning.defaults
        rows.append(f"| `{spec}` | {tuning.method.name} | {short_float(defaults.lr)} | {defaults.warmup:.0%} | "
                    f"{text(defaults.source)} |")
    families = ", ".join(f"`{name}`" for name in METHODS)
    return DEFAULTS_INTRO + "\n".join(rows) + f"\n\nFamilies registered, in the order they are asked: {families}.\n"


DATASETS_INTRO = """\
# Dataset presets

Generated from `attnft/data/presets.py` when the site is built: every name `--dataset` takes besides a folder or a hub
id. Hub presets read a local copy given with `--data-dir` (a run without one, offline, prints the `hf download`
command that makes it); [the presets tutorial](../tutorials/presets.md) walks through Flowers, Cars and iNaturalist.

| preset | dataset | source | classes | train split | eval split | notes |
|---|---|---|---:|---|---|---|
"""


def datasets_page() -> str:
    from attnft.data.presets import PRESETS

    rows = []
    for preset in PRESETS.values():
        source = f"hub `{preset.hub_id}`" if preset.hub_id else f"local files ({preset.layout})"
        if preset.revision:
            source += f" at `{preset.revision[:12]}`"
        rows.append(f"| `{preset.name}` | {text(preset.title)} | {source} | {preset.num_classes:,} | "
                    f"`{preset.train_split}` | `{preset.eval_split}` | {text(preset.notes)} |")
    return DATASETS_INTRO + "\n".join(rows) + "\n"


if __name__ == "<run_path>":  # mkdocs-gen-files
    import mkdocs_gen_files

    with mkdocs_gen_files.open(CONFIG_PAGE, "w") as out:
        out.write(config_page())
    mkdocs_gen_files.set_edit_path(CONFIG_PAGE, "../attnft/training/config.py")
    with mkdocs_gen_files.open(DEFAULTS_PAGE, "w") as out:
        out.write(defaults_page())
    mkdocs_gen_files.set_edit_path(DEFAULTS_PAGE, "../attnft/methods/registry.py")
    with mkdocs_gen_files.open(DATASETS_PAGE, "w") as out:
        out.write(datasets_page())
    mkdocs_gen_files.set_edit_path(DATASETS_PAGE, "../attnft/data/presets.py")
