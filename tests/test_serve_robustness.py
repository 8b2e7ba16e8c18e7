"""``attnft serve`` under what a robustness review (issue 39) threw at it: a real server process on a free port of
127.0.0.1, real HTTP and real sockets.

The store holds a 28 px task of the bundled ``vit_fmnist_patch4_28`` and a 224 px one of ``vit_fmnist_patch32_224``
(a 7x7 grid at 224 px: a forward pass costs what the 28 px one does).
"""
import io
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from PIL import Image

from attnft.adapters.store import AdapterStore
from attnft.core.files import CONFIG_FILE
from attnft.bundled import BUNDLED_MODEL_224
from serve_helpers import (
    REQUEST_TIMEOUT_S, ROOT, START_TIMEOUT_S, Server, die_with_parent, peak_rss_mb, png, save_attn_adapter,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = AdapterStore(tmp_path_factory.mktemp("robust") / "adapters")
    save_attn_adapter(store, "shirts", 5, 0)
    save_attn_adapter(store, "wide", 4, 1, base=BUNDLED_MODEL_224)
    return store


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    with Server(store, tmp_path_factory.mktemp("server")) as server:
        yield server


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height), 128).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_100000x1_and_a_1x100000_png_cost_the_server_their_source_and_output_not_their_resize(server):
    """timm's eval resize would make 100000x1 22,400,000x224 pixels at 224 px and 2,800,000x28 at 28 px (235 MB of
    RGB, under PIL's pixel limit) before keeping the centre: the crop's box is resampled instead, and both answer."""
    thin = [_png(100_000, 1), _png(1, 100_000)]
    assert all(len(data) < 2000 for data in thin)
    for task in ("wide", "shirts"):  # each base created, its adapter loaded, a forward run: the peak settled
        assert server.classify(task, png(1, size=224 if task == "wide" else 28)).status_code == 200
    before = peak_rss_mb(server.process.pid)
    for task in ("wide", "shirts"):
        for data in thin:
            response = server.classify(task, data)
            assert response.status_code == 200, response.text
    assert peak_rss_mb(server.process.pid) - before < 50


# --- start-up and shutdown of the process ----------------------------------------------------------------------


class _Started:
    """``attnft serve`` with its stdout on a pipe, read line by line as it is printed: the moment it names its URL."""

    def __init__(self, store, tmp_path, *args):
        self.err = tmp_path / f"serve-{time.monotonic_ns()}.err"
        with open(self.err, "w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "attnft", "serve", "--store", str(store.root), "--port", "0", *args],
                stdout=subprocess.PIPE, stderr=err, env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
                cwd=tmp_path, preexec_fn=die_with_parent,
            )
        self.url = self._read_url()

    def _read_url(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(timeout=1):
                    continue
                line = self.process.stdout.readline().decode()
                match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
                if match:
                    return match.group(0)
                if not line:
                    break
        self.process.kill()
        raise AssertionError(f"no URL printed:\n{self.err.read_text()[-3000:]}")

    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, timeout: float = REQUEST_TIMEOUT_S) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.process.stdout.close()


def test_the_url_is_printed_once_the_socket_listens(store, tmp_path):
    """A client (a supervisor, a test) that connects as soon as it reads the URL is answered, never refused."""
    for _ in range(2):  # before, refused every time
        started = _Started(store, tmp_path, "--tasks", "shirts")
        try:
            with socket.create_connection(("127.0.0.1", started.port()), timeout=10) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        finally:
            assert started.stop() == 0


def test_sigterm_while_a_body_is_half_sent_stops_in_a_line_or_two_and_answers_503(store, tmp_path):
    """uvicorn cancels what still runs when --graceful-timeout ends: the request waiting for the rest of its body
    used to die with a CancelledError's 50-line traceback; now the client gets 503 and the log one line."""
    with Server(store, tmp_path, "--tasks", "shirts", "--graceful-timeout", "1", "--body-timeout", "600") as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/tasks/shirts/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                         b"Content-Length: 5000\r\n\r\n" + png(3)[:100])
            time.sleep(0.5)
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=30) == 0
            reply = sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 503") and b'"kind":"stopped"' in reply, reply
        err = server.stderr()
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
        assert err.strip().endswith("attnft serve: stopped (SIGTERM)")


# --- the store ----------------------------------------------------------------------------------------------


def test_a_store_replaced_by_a_file_answers_503_in_one_line_and_serves_again_once_it_is_back(store, tmp_path):
    local = AdapterStore(tmp_path / "store")
    shutil.copytree(store.path("shirts"), local.path("shirts"))
    with Server(local, tmp_path) as server:
        assert server.classify("shirts", png(1)).status_code == 200
        aside = tmp_path / "aside"
        local.root.rename(aside)
        local.root.write_text("not a store")
        for response in (server.classify("shirts", png(2)), server.classify("nope", png(2)),
                         server.client.get("/v1/tasks")):
            assert response.status_code == 503, response.text
            body = response.json()
            assert body["kind"] == "store_unavailable" and "is a file, not a folder" in body["error"]
            assert "\n" not in body["error"]
        local.root.unlink()
        aside.rename(local.root)
        assert server.classify("shirts", png(3)).status_code == 200
        assert [task["name"] for task in server.client.get("/v1/tasks").json()["tasks"]] == ["shirts"]
        assert "Traceback" not in server.stderr()


HUGE_CONFIG_BYTES = 300 * 2**20


def test_a_huge_adapter_config_is_refused_unread_off_the_event_loop_while_health_and_other_tasks_answer(
        store, tmp_path):
    """A changed config is re-read by the next request naming its task: 300 MB of it (a sparse file) held the event
    loop for all of the read (1-2 s here), so no other request was answered meanwhile. Now it is looked at in the
    pool, and refused unread (a config is at most 64 MB): each of three such tasks answers 503 in one line at once,
    while /healthz and another task keep answering."""
    local = AdapterStore(tmp_path / "store")
    names = [f"huge{i}" for i in range(3)]
    for name in ["shirts", *names]:
        shutil.copytree(store.path("shirts"), local.path(name))
    with Server(local, tmp_path, "--workers", "2") as server:
        assert server.classify("shirts", png(1)).status_code == 200
        for name in names:
            with open(local.path(name) / CONFIG_FILE, "r+b") as config:
                config.truncate(HUGE_CONFIG_BYTES)  # its JSON followed by NUL bytes: sparse, a few KB on disk
        reads = []  # (start, end, status) of each request that reads a huge config

        def read_them():
            for name in names:
                started = time.monotonic()
                status = server.classify(name, png(2)).status_code
                reads.append((started, time.monotonic(), status))

        reader = threading.Thread(target=read_them)
        reader.start()
        answered, deadline = [], time.monotonic() + REQUEST_TIMEOUT_S
        while reader.is_alive() and time.monotonic() < deadline:
            assert server.client.get("/healthz").status_code == 200
            assert server.classify("shirts", png(3)).status_code == 200
            answered.append(time.monotonic())
        reader.join(REQUEST_TIMEOUT_S)
        assert [status for _, _, status in reads] == [503] * len(names)  # not a config: each says why, one line
        assert max(end - start for start, end, _ in reads) < 2.0, reads  # refused, not read
        assert server.classify("shirts", png(4)).status_code == 200 and server.client.get("/healthz").status_code == 200
