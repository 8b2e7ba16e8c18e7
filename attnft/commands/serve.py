"""``attnft serve``: every adapter of the store over HTTP, one backbone per base, tasks mixed in each batch.

    attnft serve                                  # ./adapters (or $ATTNFT_STORE) on http://127.0.0.1:8000
    attnft serve --store DIR --tasks cars,pets --port 9000 --memory-budget 2GB

Needs the ``serve`` extra (``pip install attnft[serve]``: uvicorn, starlette, prometheus_client,
python-multipart), imported only here, when the command runs. The URL is printed once the socket
listens. SIGTERM or Ctrl-C stops taking new connections, lets every request in flight finish, then exits 0.
"""
import argparse
import importlib.util
import signal
import socket
import sys
import warnings

from ..server.config import ServeConfig
from ..core.parsing import add_config_arguments, config_from_args

# the serve extra: distribution -> the modules that provide it (python-multipart renamed its module)
SERVE_EXTRA = {"uvicorn": ("uvicorn",), "starlette": ("starlette",), "prometheus_client": ("prometheus_client",),
               "python-multipart": ("python_multipart", "multipart")}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the store's adapters over HTTP, tasks mixed in each batch",
        description="Serve every adapter of the store (or --tasks) over HTTP: POST /v1/tasks/TASK/classify with an "
                    "image; GET /v1/tasks, /healthz, /metrics. One backbone per base; adapters load on first use and "
                    "the least recently used are unloaded to stay within --memory-budget.",
    )
    add_config_arguments(parser, ServeConfig, recipe=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(ServeConfig, args)
    _check_extra()
    import uvicorn
    from PIL import Image

    from .. import bundled  # noqa: F401  registers the bundled models in timm
    from ..server.connections import ListeningServer, protocol_with_deadline
    from ..server.http import create_app
    from ..server.service import Service

    # the pixel limit is enforced as an error before decoding (attnft.server.inputs); PIL's warning is noise
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    sock = _bind(config.host, config.port)  # before minutes of loading: a taken port is a one-line error now
    try:
        service = Service(config)
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    started = "\n".join(service.describe(url))
    server = ListeningServer(uvicorn.Config(
        create_app(service), log_level="warning", access_log=config.access_log, lifespan="on",
        http=protocol_with_deadline(config.header_timeout), timeout_keep_alive=config.timeout_keep_alive,
        limit_concurrency=config.limit_concurrency, timeout_graceful_shutdown=config.graceful_timeout,
    ), on_listening=lambda: print(started, flush=True))  # the URL once it answers: a client told it is not refused
    stopped_by: list[int] = []
    # uvicorn drains, then raises the signal again for the handler it found: ours notes it, so a requested stop exits 0
    previous = {sig: signal.signal(sig, lambda number, frame: stopped_by.append(number))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        return 1  # uvicorn said why
    reason = f" ({signal.Signals(stopped_by[0]).name})" if stopped_by else ""
    print(f"attnft serve: stopped{reason}", file=sys.stderr, flush=True)
    return 0


def _check_extra() -> None:
    from ..core.errors import ConfigError

    missing = [name for name, modules in SERVE_EXTRA.items()
               if not any(importlib.util.find_spec(module) for module in modules)]
    if missing:
        raise ConfigError(f"attnft serve needs {', '.join(missing)}: pip install 'attnft[serve]'")


def _bind(host: str, port: int) -> socket.socket:
    from ..core.errors import ConfigError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host[:80]}: {e.strerror}") from None
    except (UnicodeError, ValueError) as e:  # a label over 63 characters, a name over 253: the IDNA codec refuses it
        raise ConfigError(f"--host {host[:80]}{'...' if len(host) > 80 else ''} is not a host name or address "
                          f"({e.__class__.__name__}: {str(e)[:80]})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock
