"""reference/cli.md, generated at build time from attnft's own argparse parsers (``attnft.cli.build_parser``): every
command, every flag, its value and its help as ``attnft COMMAND --help`` prints them, so the page cannot drift from
the code. Run by mkdocs-gen-files; tests/test_docs_reference.py compares the page with the parsers."""
from __future__ import annotations

import argparse
import html
import os
import sys
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
PAGE = "reference/cli.md"

INTRO = """\
# Command line

Generated from attnft's own parsers when the site is built, so every command and flag is here, with the help that
`attnft COMMAND --help` prints. A flag's default follows its help; `--flag` / `--no-flag` pairs set a yes/no
setting. Flags override a recipe (`--recipe FILE`), which overrides the defaults. User errors print one line and
exit with code 2.
"""


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("attnft",)
         ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """Every (command path, parser, one-line help) of ``parser`` and its subcommands, depth first."""
    yield path, parser, ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                for sub_path, sub_parser, summary in walk(sub, path + (name,)):
                    yield sub_path, sub_parser, summary or helps.get(name, "")


def text(value: str) -> str:
    """Help text for a Markdown table cell: HTML-escaped, Markdown's emphasis, code and table marks taken literally."""
    value = html.escape(" ".join(str(value).split()), quote=False)
    for mark in "\\`*_[]":
        value = value.replace(mark, "\\" + mark)
    return value.replace("|", "&#124;")


def value_of(action: argparse.Action) -> str:
    """What a flag takes, as its usage writes it: ``N``, ``{a,b,c}``, ``LOW HIGH``, or nothing for a switch."""
    if action.nargs == 0:
        return ""
    if action.choices is not None and action.metavar is None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    metavar = action.metavar or action.dest.upper()
    return " ".join(metavar) if isinstance(metavar, tuple) else str(metavar)


def command_section(path: tuple[str, ...], parser: argparse.ArgumentParser, summary: str) -> str:
    """One command: its heading, what it does, its usage, its subcommands and a table per argument group."""
    level = 2 if len(path) <= 2 else 3  # attnft and its commands, then an action of a command (adapters list)
    lines = [f"{'#' * level} `{' '.join(path)}`", ""]
    if summary:
        lines += [text(summary[0].upper() + summary[1:]) + ".", ""]
    if parser.description and parser.description != summary:
        lines += [text(parser.description), ""]
    usage = parser.format_usage().strip().removeprefix("usage: ")
    lines += ["```text", usage, "```", ""]
    formatter = parser._get_formatter()
    for group in parser._action_groups:
        rows, commands = [], []
        for action in group._group_actions:
            if isinstance(action, argparse._SubParsersAction):
                commands += [f"| [`{' '.join(path)} {c.dest}`](#{'-'.join(path)}-{c.dest}) | {text(c.help or '')} |"
                             for c in action._choices_actions]
            elif not isinstance(action, argparse._HelpAction):
                names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.dest}`"
                help_text = formatter._expand_help(action) if action.help else ""
                rows.append(f"| {names} | {f'`{value_of(action)}`' if value_of(action) else ''} | {text(help_text)} |")
        if commands and len(path) > 1:  # attnft's own commands are the page's index above
            lines += ["| command | what it does |", "|---|---|", *commands, ""]
        if rows:
            positional = group.title == "positional arguments"
            title = "arguments" if positional else group.title
            lines += [f"**{text(title)}**", "", f"| {'argument' if positional else 'flag'} | value | what it sets |",
                      "|---|---|---|", *rows, ""]
    return "\n".join(lines)


def render(parser: argparse.ArgumentParser) -> str:
    """The whole page: an index of commands, then one section per command."""
    commands = list(walk(parser))
    index = ["| command | what it does |", "|---|---|"]
    for path, _, summary in commands[1:]:
        anchor = "-".join(path)
        index.append(f"| [`{' '.join(path)}`](#{anchor}) | {text(summary)} |")
    sections = []
    for path, sub, summary in commands:
        section = command_section(path, sub, summary)
        heading, rest = section.split("\n", 1)
        sections.append(f"{heading} {{#{'-'.join(path)}}}\n{rest}")
    return "\n".join([INTRO, *index, "", *sections])


def build_parser() -> argparse.ArgumentParser:
    """attnft's parser, from this checkout, with a fixed width so the usage lines read the same on every machine."""
    sys.path.insert(0, str(REPO))
    os.environ["COLUMNS"] = "100"
    from attnft.cli import build_parser as attnft_parser

    return attnft_parser()


if __name__ == "<run_path>":  # mkdocs-gen-files
    import mkdocs_gen_files

    with mkdocs_gen_files.open(PAGE, "w") as out:
        out.write(render(build_parser()))
    mkdocs_gen_files.set_edit_path(PAGE, "../attnft/cli.py")
