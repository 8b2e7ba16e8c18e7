"""The ``attnft`` command line: one subcommand per module in :mod:`attnft.commands`.

Each command module exposes ``add_parser(subparsers)`` and ``run(args) -> int``. User
errors (:class:`attnft.core.errors.AttnftError`) become one line on stderr and exit code 2.
"""
import argparse
import importlib
import os
import sys

# Before torch loads: OpenMP threads that spin while idle stall badly when data-loader workers
# or other jobs share the cores (10x slower steps measured on 2 shared cores); sleeping costs little.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .core.errors import AttnftError, ReportedElsewhere

# command name -> module under attnft.commands; each module registers its own flags
COMMANDS = {
    "policies": "policies",
    "finetune": "finetune",
    "compare": "compare",
    "eval": "evaluate",
    "adapters": "adapters",
    "serve": "serve",
}


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we want one line and exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="attnft", description="Attention-only fine-tuning of Vision Transformers.")
    from .core.version import __version__

    parser.add_argument("--version", action="version", version=f"attnft {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_OneLineParser)
    subparsers.required = True
    for module_name in COMMANDS.values():
        try:
            module = importlib.import_module(f"attnft.commands.{module_name}")
        except ModuleNotFoundError as e:
            if e.name != f"attnft.commands.{module_name}":
                raise
            continue  # command not built yet
        module.add_parser(subparsers)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.run(args) or 0
        sys.stdout.flush()  # a reader that went away shows here, not as a traceback at exit
        return code
    except ReportedElsewhere:
        return 2  # another process of the run printed why
    except AttnftError as e:
        if os.environ.get("RANK", "0") == "0":  # every process of a distributed run found it: rank 0 says it
            print(f"attnft: error: {' '.join(str(e).split())}", file=sys.stderr)  # one line, always
        return 2
    except KeyboardInterrupt:
        print("attnft: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `attnft adapters show NAME | head -1`: the reader closed the pipe. Python's recipe (see
        # the signal module's note on SIGPIPE): point stdout at devnull so the flush at exit is quiet.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass  # stdout is not a file descriptor (captured in tests): nothing will flush to the pipe
        return 1


if __name__ == "__main__":
    sys.exit(main())
