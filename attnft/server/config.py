"""What ``attnft serve`` does, as typed data: one field per flag, checked when built.

Kept free of torch, timm and the HTTP libraries, so that building the command line stays fast
and ``attnft --help`` never needs the ``serve`` extra. Sizes are text (``2GB``, ``512MB``) read
by :func:`attnft.core.parsing.parse_bytes` once, here: :attr:`ServeConfig.memory_budget_bytes` and
:attr:`ServeConfig.max_body_bytes` are what the server receives.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from ..core.checks import PRECISIONS, require
from ..core.errors import ConfigError
from ..core.parsing import coerce_fields, option, parse_bytes

MAX_TIMEOUT_S = 86_400.0  # a day
MAX_WAIT_MS = 10_000.0  # beyond this a lone request waits longer than any client would
SERVER, ENGINE, LIMITS = "server", "engine", "limits"


_opt = option  # a field with its flag's help (core.parsing)


@dataclass
class ServeConfig:
    """One server: which adapters, where it listens, how it batches, what it refuses."""

    store: Optional[str] = _opt(None, "adapter store directory (default: $ATTNFT_STORE or ./adapters)", metavar="DIR",
                                group=SERVER)
    tasks: Optional[str] = _opt(None, "serve only these adapters, comma-separated (default: every adapter in the store, "
                                "and any added while serving)", metavar="A,B,C", group=SERVER)
    host: str = _opt("127.0.0.1", "address to listen on (0.0.0.0: every interface)", metavar="ADDRESS", group=SERVER)
    port: int = _opt(8000, "port to listen on (0: any free port, printed at start-up)", group=SERVER)
    checkpoint: Optional[str] = _opt(None, "weights file of the base the adapters were trained on (default: its "
                                     "pretrained weights); only for a store of one base model", metavar="FILE",
                                     group=SERVER)
    access_log: bool = _opt(False, "log every request (uvicorn's access log)", group=SERVER)
    max_batch: int = _opt(32, "images per model call, mixing tasks", group=ENGINE)
    max_wait_ms: float = _opt(0.0, "how long an idle model waits for more images before it runs what is queued "
                              "(milliseconds); 0: never, a batch forms from what arrives while the model is busy "
                              "(continuous batching)", group=ENGINE)
    memory_budget: Optional[str] = _opt(None, "memory for backbones and loaded adapters, e.g. 2GB; least recently "
                                        "used adapters are unloaded to stay within it (default: no limit)",
                                        metavar="SIZE", group=ENGINE)
    device: Optional[str] = _opt(None, "cpu, cuda, cuda:1, ... (default: cuda if available)", metavar="DEVICE",
                                 group=ENGINE)
    precision: str = _opt("no", "no (float32), bf16 or fp16: the dtype of backbones and adapters", choices=PRECISIONS,
                          group=ENGINE)
    workers: int = _opt(4, "threads decoding and preprocessing images, beside the model's thread", group=ENGINE)
    max_body: str = _opt("10MB", "largest request body; larger ones get 413", metavar="SIZE", group=LIMITS)
    max_queue: int = _opt(256, "images admitted and not yet in a batch; beyond it requests get 503 with Retry-After",
                          group=LIMITS)
    limit_concurrency: int = _opt(256, "connections and requests at once; beyond it uvicorn answers 503", group=LIMITS)
    timeout_keep_alive: float = _opt(5.0, "seconds an idle kept-alive connection stays open", group=LIMITS)
    header_timeout: float = _opt(10.0, "seconds a request's headers may take from the connection (or the previous "
                                 "response): a slow or silent client is disconnected", group=LIMITS)
    body_timeout: float = _opt(30.0, "seconds a request's body may take once its headers are in; beyond it 408",
                               group=LIMITS)
    graceful_timeout: float = _opt(5.0, "seconds SIGTERM / SIGINT waits for requests in flight before the server "
                                   "exits anyway", group=LIMITS)

    def __post_init__(self) -> None:
        coerce_fields(self)
        require(0 <= self.port <= 65535, f"port must be in 0-65535, got {self.port}")
        require(self.max_batch >= 1, "max_batch must be at least 1")
        require(0 <= self.max_wait_ms <= MAX_WAIT_MS, f"max_wait_ms must be in [0, {MAX_WAIT_MS:g}], got {self.max_wait_ms}")
        require(self.workers >= 1, "workers must be at least 1")
        require(self.max_queue >= 1, "max_queue must be at least 1")
        require(1 <= self.limit_concurrency <= 1_000_000, f"limit_concurrency must be from 1 to 1000000, got "
                 f"{self.limit_concurrency}")
        for name in ("timeout_keep_alive", "header_timeout", "body_timeout", "graceful_timeout"):
            value = getattr(self, name)
            require(0 < value <= MAX_TIMEOUT_S, f"{name} must be in (0, {MAX_TIMEOUT_S:g}] seconds, got {value}")
        require(self.precision in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}")
        require(self.host.strip() != "", "host must not be empty")
        for name in ("memory_budget", "max_body"):
            value = getattr(self, name)
            if value is not None:
                try:
                    parse_bytes(value)
                except ValueError as e:
                    raise ConfigError(f"{name}: {e}") from None
        if self.tasks is not None:
            require(bool(self.task_names), "tasks must name at least one adapter")
        for name in ("store", "checkpoint", "device"):
            value = getattr(self, name)
            require(value is None or value.strip() != "", f"{name} must not be empty")

    @property
    def task_names(self) -> Optional[list[str]]:
        """The ``--tasks`` names in order, without repeats (None: every adapter of the store)."""
        if self.tasks is None:
            return None
        return list(dict.fromkeys(name.strip() for name in self.tasks.split(",") if name.strip()))

    @property
    def memory_budget_bytes(self) -> Optional[int]:
        return parse_bytes(self.memory_budget) if self.memory_budget is not None else None

    @property
    def max_body_bytes(self) -> int:
        return parse_bytes(self.max_body)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
