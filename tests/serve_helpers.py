"""What the tests of ``attnft serve`` share: tiny adapters of the bundled base, images, a server process (or the
server in this process, on a real socket), offline answers."""
import io
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
import zlib
from pathlib import Path

import httpx
import numpy as np
import torch
from PIL import Image

from attnft.methods.record import AdapterRecord
from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.data import build_transforms, decode_image
from attnft.models import create_model
from attnft.multitask import MultiTaskModel
from attnft.methods.freeze.policy import apply_policy

BASE = "vit_fmnist_patch4_28"
TOLERANCE = 1e-5  # fp32
ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 60


# --- the store ---------------------------------------------------------------------------------


def save_attn_adapter(store, name, num_classes, seed, *, img_size=None, overwrite=False, base=BASE):
    """A fine-tuned-looking attention adapter of ``base``: its attention, head and pos_embed moved by seeded noise."""
    model = create_model(base, img_size=img_size)
    model.reset_classifier(num_classes)
    report = apply_policy(model, "attn")
    snapshot = BaseSnapshot.capture(model, report)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in (p for p in model.parameters() if p.requires_grad):
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    store.save(name, model, report, snapshot, AdapterRecord.of(model, label_names=[f"{name}-{i}" for i in range(num_classes)]),
               overwrite=overwrite)


def save_lora_adapter(store, name, seed):
    from attnft import apply_peft_policy

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft: a timm model has no hub config
        model, report = apply_peft_policy(create_model(BASE), "lora:r=2")
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in (p for p in model.parameters() if p.requires_grad):
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
        store.save(name, model.eval(), report)


class Offline:
    """What multi-task serving gives for an image, without a server: eval's decoding and transform, then
    MultiTaskModel (PeftMultiTask for peft adapters) on a base of the adapter's size."""

    def __init__(self, store):
        self.store = store
        self._served = {}  # (task, weights sha256) -> its server

    def probabilities(self, task: str, data: bytes) -> torch.Tensor:
        config = self.store.config(task)
        x = build_transforms(dict(config.data_config), train=False)(decode_image(data)).unsqueeze(0)
        key = (task, config.weights_sha256)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if key not in self._served:
                base = create_model(BASE, img_size=config.input_size)
                self._served[key] = MultiTaskModel.from_store(self.store, [task], base_model=base)
            return torch.softmax(self._served[key](x, task=task)[0].float(), dim=-1)


def png(seed: int, size: int = 28, mode: str = "L") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels and whose data is empty: a decompression bomb's shape."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


# --- a server process ------------------------------------------------------------------------------


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, so no server outlives a killed test run (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Served:
    """What a test sends to a server at ``self.url`` through ``self.client``."""

    url: str
    client: httpx.Client

    def classify(self, task: str, data: bytes, **params):
        return self.client.post(f"/v1/tasks/{task}/classify", content=data, params=params,
                                headers={"content-type": "image/png"})


class InProcessServer(Served):
    """``attnft serve``'s Service and app in this process, uvicorn on a free port of 127.0.0.1 in a thread: real HTTP
    and sockets, and the test can wrap the server's own functions (a counting spy) while it serves.

    ``options``: :class:`attnft.server.config.ServeConfig` fields beside the store and the port.
    """

    def __init__(self, store, **options):
        import uvicorn

        from attnft.server.config import ServeConfig
        from attnft.server.http import create_app
        from attnft.server.service import Service

        self.service = Service(ServeConfig(store=str(store.root), port=0, **options))
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.server = uvicorn.Server(uvicorn.Config(create_app(self.service), log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.client = httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S)

    def __enter__(self) -> "InProcessServer":
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(REQUEST_TIMEOUT_S)
        self.socket.close()
        assert not self.thread.is_alive(), "the server did not stop"


class Server(Served):
    """``attnft serve`` as a subprocess on a free port; its output goes to files (a full pipe would stall it)."""

    def __init__(self, store, tmp_path, *args, env=None):
        self.log = tmp_path / f"serve-{time.monotonic_ns()}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
        with open(f"{self.log}.out", "w") as out, open(f"{self.log}.err", "w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "attnft", "serve", "--store", str(store.root), "--port", "0", *args],
                stdout=out, stderr=err, env=env, cwd=tmp_path, preexec_fn=die_with_parent,
            )
        self.url = self._wait_for_url()
        self.client = httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S)
        self._wait_healthy()

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            match = re.search(r"http://127\.0\.0\.1:\d+", Path(f"{self.log}.out").read_text())
            if match:
                return match.group(0)
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.process.kill()
        raise AssertionError(f"the server did not start:\n{self.stderr()[-3000:]}")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if self.client.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError("the server never answered /healthz")

    def stdout(self) -> str:
        return Path(f"{self.log}.out").read_text()

    def stderr(self) -> str:
        return Path(f"{self.log}.err").read_text()

    def metric(self, name: str, labels: str = "") -> float:
        text = self.client.get("/metrics").text
        pattern = rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''} (\S+)$"
        values = [float(m.group(1)) for m in re.finditer(pattern, text, re.MULTILINE)]
        return sum(values)

    def wait_queued(self, count: int) -> None:
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while self.client.get("/healthz").json()["queued"] < count:
            assert time.monotonic() < deadline, "the requests never reached the queue"
            time.sleep(0.02)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> int:
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=REQUEST_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def assert_equal_to_offline(answer: dict, expected: torch.Tensor) -> None:
    predictions = answer["predictions"]
    assert len(predictions) == expected.numel()
    got = torch.tensor([p["probability"] for p in sorted(predictions, key=lambda p: p["index"])])
    assert (got - expected).abs().max().item() <= TOLERANCE
    assert [p["probability"] for p in predictions] == sorted((p["probability"] for p in predictions), reverse=True)


def in_background(function, *args, **kwargs):
    """Run ``function(*args, **kwargs)`` in a thread; the returned join() gives its result (or raises its error)."""
    box = {}

    def target():
        try:
            box["result"] = function(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    thread = threading.Thread(target=target)
    thread.start()

    def join():
        thread.join(REQUEST_TIMEOUT_S)
        assert not thread.is_alive(), "the request never finished"
        if "error" in box:
            raise box["error"]
        return box["result"]

    return join
