"""``attnft serve``: a real server process on a free port, real HTTP, answers equal to offline multi-task serving.

The store holds tiny adapters of the bundled ``vit_fmnist_patch4_28`` (its weights ship in the
package, so the server creates the base by name): three attnft tasks at 28 px with 5, 7 and 10
classes, one at 56 px (a second base), a LoRA adapter (a third: peft's own backbone), one
for the overwrite test and one whose weights were corrupted after saving.
"""
import asyncio
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from attnft.cli import main
from attnft.core.files import CONFIG_FILE, WEIGHTS_FILE
from attnft.models import create_model
from attnft.adapters.store import AdapterStore
from serve_helpers import (
    BASE, REQUEST_TIMEOUT_S, ROOT, Offline, Server, assert_equal_to_offline, in_background, png, png_header,
    save_attn_adapter, save_lora_adapter,
)

TASKS_28 = {"shirts": 5, "shoes": 7, "bags": 10}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = AdapterStore(tmp_path_factory.mktemp("serve") / "adapters")
    for seed, (name, classes) in enumerate(TASKS_28.items()):
        save_attn_adapter(store, name, classes, seed)
    save_attn_adapter(store, "big56", 4, 10, img_size=56)
    save_attn_adapter(store, "swap", 3, 20)
    save_attn_adapter(store, "broken", 3, 30)
    save_lora_adapter(store, "lora-a", 40)
    weights = store.path("broken") / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"  # the last float becomes inf: the sha256 no longer matches
    weights.write_bytes(bytes(data))
    save_attn_adapter(store, "tampered", 3, 50)
    config = json.loads((store.path("tampered") / CONFIG_FILE).read_text())
    (store.path("tampered") / CONFIG_FILE).write_text(json.dumps(dict(config, model_name=123)))  # unreadable
    return store


@pytest.fixture(scope="module")
def offline(store):
    return Offline(store)


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    with Server(store, tmp_path_factory.mktemp("server"), "--max-wait-ms", "30", "--max-body", "200KB") as server:
        yield server


# --- answers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["shirts", "shoes", "bags", "big56"])
def test_an_image_sent_alone_gets_the_offline_multitask_answer(server, store, offline, task):
    data = png(1)
    response = server.classify(task, data, top_k=store.config(task).num_classes)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["task"] == task and answer["adapter"]["name"] == task
    assert answer["adapter"]["weights_sha256"] == store.config(task).weights_sha256
    assert answer["base"] == {"model": store.config(task).model_name, "input_size": store.config(task).input_size}
    assert answer["predictions"][0]["label"].startswith(f"{task}-")
    assert_equal_to_offline(answer, offline.probabilities(task, data))


def test_concurrent_requests_of_mixed_tasks_share_batches_and_get_the_offline_answers(server, offline):
    requests = [(task, png(10 + i)) for i, task in enumerate(list(TASKS_28) * 8)]
    batches_before = server.metric("attnft_batch_tasks_count")
    single_task_before = server.metric("attnft_batch_tasks_bucket", 'le="1.0"')

    async def send_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
            calls = [client.post(f"/v1/tasks/{task}/classify", content=data, params={"top_k": TASKS_28[task]},
                                 headers={"content-type": "image/png"}) for task, data in requests]
            return await asyncio.wait_for(asyncio.gather(*calls), REQUEST_TIMEOUT_S)

    responses = asyncio.run(send_all())
    for (task, data), response in zip(requests, responses):
        assert response.status_code == 200, response.text
        assert_equal_to_offline(response.json(), offline.probabilities(task, data))
    batches = server.metric("attnft_batch_tasks_count") - batches_before
    mixed = batches - (server.metric("attnft_batch_tasks_bucket", 'le="1.0"') - single_task_before)
    assert batches < len(requests) and mixed >= 1, f"{batches} batches for {len(requests)} images, {mixed} mixed"


def test_the_batch_forms_answer_every_image_in_order(server, offline):
    images = [png(30), png(31, mode="RGB"), png(32)]
    encoded = [base64.b64encode(image).decode() for image in images]
    as_json = server.client.post("/v1/tasks/shoes/classify", json={"images": encoded, "top_k": 7})
    files = [("images", (f"{i}.png", image, "image/png")) for i, image in enumerate(images)]
    as_files = server.client.post("/v1/tasks/shoes/classify", files=files, data={"top_k": "7"})
    for response in (as_json, as_files):
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert len(results) == len(images)
        for result, image in zip(results, images):
            assert_equal_to_offline(result, offline.probabilities("shoes", image))


def test_json_and_a_single_multipart_file_take_one_image(server, offline):
    data = png(40)
    as_json = server.client.post("/v1/tasks/bags/classify", json={"image": base64.b64encode(data).decode(), "top_k": 10})
    as_file = server.client.post("/v1/tasks/bags/classify?top_k=10", files={"image": ("x.png", data, "image/png")})
    for response in (as_json, as_file):
        assert response.status_code == 200, response.text
        assert_equal_to_offline(response.json(), offline.probabilities("bags", data))


def test_top_k_defaults_to_five_best_first(server):
    predictions = server.classify("bags", png(41)).json()["predictions"]
    assert len(predictions) == 5
    assert predictions == sorted(predictions, key=lambda p: -p["probability"])


def test_a_peft_lora_adapter_is_served_on_its_own_backbone(server, store, offline):
    data = png(50)
    response = server.classify("lora-a", data, top_k=10)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["adapter"]["format"] == "peft-lora"
    assert answer["adapter"]["weights_sha256"] == store.config("lora-a").weights_sha256
    assert_equal_to_offline(answer, offline.probabilities("lora-a", data))


def test_get_tasks_lists_each_tasks_base_classes_input_size_format_and_state(server, store):
    server.classify("shirts", png(60))
    tasks = {task["name"]: task for task in server.client.get("/v1/tasks").json()["tasks"]}
    assert set(tasks) >= {"shirts", "shoes", "bags", "big56", "swap", "broken", "lora-a"}
    shirts = tasks["shirts"]
    assert shirts["classes"] == 5 and shirts["input_size"] == 28 and shirts["format"] == "attnft"
    assert shirts["base"] == store.config("shirts").model_name and shirts["loaded"] is True
    assert shirts["labels"] == [f"shirts-{i}" for i in range(5)] and shirts["status"] == "ok"
    assert tasks["big56"]["input_size"] == 56 and tasks["lora-a"]["format"] == "peft-lora"


def test_start_up_prints_the_url_the_tasks_their_base_and_memory(server):
    out = server.stdout()
    assert server.url in out
    assert re.search(r"base vit_fmnist_patch4_28\S* at 28 px \(attnft adapters\): [\d.]+ MB", out)
    assert re.search(r"base vit_fmnist_patch4_28\S* at 56 px \(attnft adapters\)", out)
    assert re.search(r"base vit_fmnist_patch4_28\S* at 28 px \(peft lora adapters\)", out)
    assert re.search(r"task shirts .*5 classes\): [\d.]+ kB", out)


def test_metrics_count_requests_errors_batches_and_latency(server):
    server.classify("shirts", png(70))
    server.classify("nope", png(70))
    text = server.client.get("/metrics").text
    for name in ("attnft_requests_total", "attnft_errors_total", "attnft_batch_size_bucket", "attnft_queue_wait_seconds",
                 "attnft_request_seconds_bucket", "attnft_adapters_loaded", "attnft_adapter_evictions_total"):
        assert name in text
    assert server.metric("attnft_requests_total", 'status="200",task="shirts"') >= 1
    assert server.metric("attnft_errors_total", 'kind="unknown_task"') >= 1


# --- the store changes while serving ------------------------------------------------------------------


def test_a_new_adapter_written_while_serving_is_served_without_restart(server, store, offline):
    assert server.classify("fresh", png(80)).status_code == 404
    save_attn_adapter(store, "fresh", 6, 81)
    data = png(82)
    response = server.classify("fresh", data, top_k=6)
    assert response.status_code == 200, response.text
    assert_equal_to_offline(response.json(), offline.probabilities("fresh", data))
    assert "fresh" in {task["name"] for task in server.client.get("/v1/tasks").json()["tasks"]}


def test_an_overwritten_adapter_is_reloaded_and_named_by_its_new_hash(server, store, offline):
    data = png(90)
    before = server.classify("swap", data, top_k=3).json()
    save_attn_adapter(store, "swap", 3, 91, overwrite=True)
    after = server.classify("swap", data, top_k=3).json()
    assert before["adapter"]["weights_sha256"] != after["adapter"]["weights_sha256"]
    assert after["adapter"]["weights_sha256"] == store.config("swap").weights_sha256
    assert_equal_to_offline(after, offline.probabilities("swap", data))


def test_a_deleted_adapter_is_no_longer_served(server, store):
    save_attn_adapter(store, "gone", 3, 95)
    assert server.classify("gone", png(96)).status_code == 200
    store.delete("gone")
    response = server.classify("gone", png(96))
    assert response.status_code == 404 and response.json()["kind"] == "unknown_task"


# --- bad input -------------------------------------------------------------------------------------------


def _bad_requests():
    image = png(100)
    b64 = base64.b64encode(image).decode()
    raw = {"content-type": "image/png"}
    return {
        "unknown task": ("nope", dict(content=image, headers=raw), 404, "unknown_task"),
        "a name reaching outside the store": ("%2E%2E", dict(content=image, headers=raw), 404, "unknown_task"),
        "a body that is no image": ("shirts", dict(content=b"hello, not an image", headers=raw), 400, "not_an_image"),
        "an empty body": ("shirts", dict(content=b"", headers=raw), 400, "not_an_image"),
        "a truncated image": ("shirts", dict(content=image[: len(image) // 2], headers=raw), 400, "corrupt_image"),
        "a bomb PIL warns about": ("shirts", dict(content=png_header(10_000, 10_000), headers=raw), 413, "decompression_bomb"),
        "a bomb PIL refuses": ("shirts", dict(content=png_header(30_000, 30_000), headers=raw), 413, "decompression_bomb"),
        "a body over --max-body": ("shirts", dict(content=b"\x89PNG" + b"0" * 300_000, headers=raw), 413, "too_large"),
        "JSON without the field": ("shirts", dict(json={"picture": b64}), 400, "missing_field"),
        "a body that is no JSON": ("shirts", dict(content=b"{nope", headers={"content-type": "application/json"}), 400, "bad_json"),
        "base64 that is not": ("shirts", dict(json={"image": "***"}), 400, "bad_base64"),
        "top_k zero": ("shirts", dict(json={"image": b64, "top_k": 0}), 400, "bad_top_k"),
        "top_k over the classes": ("shirts", dict(json={"image": b64, "top_k": 6}), 400, "bad_top_k"),
        "top_k not a number": ("shirts", dict(content=image, headers=raw, params={"top_k": "many"}), 400, "bad_top_k"),
        "a media type that is no image": ("shirts", dict(content=b"x", headers={"content-type": "text/plain"}), 415,
                                          "unsupported_media_type"),
        "multipart without a file": ("shirts", dict(files={}, data={"top_k": "2"}), 400, "missing_field"),
    }


@pytest.mark.parametrize("case", list(_bad_requests()))
def test_bad_input_gets_a_4xx_with_a_one_line_reason(server, case):
    task, request, status, kind = _bad_requests()[case]
    if case == "multipart without a file":
        request = dict(content=b"--b\r\nContent-Disposition: form-data; name=\"top_k\"\r\n\r\n2\r\n--b--\r\n",
                       headers={"content-type": "multipart/form-data; boundary=b"})
    response = server.client.post(f"/v1/tasks/{task}/classify", **request)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["kind"] == kind and body["error"] and "\n" not in body["error"]
    assert server.classify("shirts", png(101)).status_code == 200  # and the server serves on


def test_a_body_over_max_body_sent_in_chunks_is_refused_too(server):
    def chunks():
        for _ in range(30):
            yield b"0" * 10_000

    response = server.client.post("/v1/tasks/shirts/classify", content=chunks(), headers={"content-type": "image/png"})
    assert response.status_code == 413 and response.json()["kind"] == "too_large"


def test_an_adapter_failing_verify_answers_503_with_the_reason_and_the_others_serve_on(server):
    response = server.classify("broken", png(110))
    assert response.status_code == 503
    assert "sha256" in response.json()["error"] and response.json()["kind"] == "adapter_unavailable"
    assert server.classify("broken", png(110)).status_code == 503  # known now: refused before it is queued
    assert server.classify("shirts", png(110)).status_code == 200
    broken = {t["name"]: t for t in server.client.get("/v1/tasks").json()["tasks"]}["broken"]
    assert broken["status"] == "unavailable" and "sha256" in broken["error"]


def test_an_adapter_whose_config_is_unreadable_answers_503_and_the_others_serve_on(server, offline):
    response = server.classify("tampered", png(111))
    assert response.status_code == 503 and response.json()["kind"] == "adapter_unavailable"
    assert "model_name" in response.json()["error"] and "\n" not in response.json()["error"]
    tampered = {t["name"]: t for t in server.client.get("/v1/tasks").json()["tasks"]}["tampered"]
    assert tampered["status"] == "unavailable" and "model_name" in tampered["error"]
    assert_equal_to_offline(server.classify("shirts", png(111), top_k=5).json(), offline.probabilities("shirts", png(111)))


def test_a_full_queue_answers_503_with_retry_after(store, tmp_path):
    with Server(store, tmp_path, "--tasks", "shirts", "--max-wait-ms", "3000", "--max-batch", "64", "--max-queue", "2") as slow:
        waiting = [in_background(slow.classify, "shirts", png(120 + i)) for i in range(2)]
        slow.wait_queued(2)
        response = slow.classify("shirts", png(122))
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert response.json()["kind"] == "queue_full"
        assert [join().status_code for join in waiting] == [200, 200]


def test_sigterm_drains_the_requests_in_flight_then_exits_0(store, tmp_path, offline):
    with Server(store, tmp_path, "--tasks", "shirts,shoes", "--max-wait-ms", "2000", "--max-batch", "64") as slow:
        images = [("shirts", png(130)), ("shoes", png(131)), ("shirts", png(132))]
        waiting = [in_background(slow.classify, task, data, top_k=TASKS_28[task]) for task, data in images]
        slow.wait_queued(len(images))
        slow.process.send_signal(signal.SIGTERM)
        for (task, data), join in zip(images, waiting):
            response = join()
            assert response.status_code == 200, response.text
            assert_equal_to_offline(response.json(), offline.probabilities(task, data))
        assert slow.process.wait(timeout=REQUEST_TIMEOUT_S) == 0
        assert "stopped (SIGTERM)" in slow.stderr()


def test_eviction_under_a_small_budget_keeps_answers_right(store, tmp_path, offline):
    backbone = create_model(BASE)
    backbone_bytes = sum(t.untyped_storage().nbytes() for t in list(backbone.parameters()) + list(backbone.buffers()))
    largest = max(store.config(task).trained_params for task in TASKS_28) * 4
    budget = backbone_bytes + int(1.5 * largest)  # one adapter at a time
    flags = ["--tasks", ",".join(TASKS_28), "--memory-budget", str(budget), "--max-wait-ms", "20"]
    with Server(store, tmp_path, *flags) as small:
        sequence = [(task, png(140 + i)) for i, task in enumerate(list(TASKS_28) * 3)]
        for task, data in sequence:
            response = small.classify(task, data, top_k=TASKS_28[task])
            assert response.status_code == 200, response.text
            assert_equal_to_offline(response.json(), offline.probabilities(task, data))
        joins = [in_background(small.classify, task, data, top_k=TASKS_28[task]) for task, data in sequence]
        for (task, data), join in zip(sequence, joins):  # mixed batches that cannot all be loaded at once
            assert_equal_to_offline(join().json(), offline.probabilities(task, data))
        assert small.metric("attnft_adapter_evictions_total") >= len(sequence) - 1
        assert small.metric("attnft_resident_bytes") <= budget
        assert sum(t["loaded"] for t in small.client.get("/v1/tasks").json()["tasks"]) == 1


# --- start-up, the CLI edge, the README ---------------------------------------------------------------


@pytest.mark.parametrize("flags,message", [
    (["--tasks", "shirts,nope"], "--tasks names nope"),
    (["--memory-budget", "100kB"], "cannot hold the backbones"),
    (["--memory-budget", "lots"], "is not a size"),
    (["--max-batch", "0"], "max_batch must be at least 1"),
    (["--port", "70000"], "port must be in 0-65535"),
    (["--max-wait-ms", "nan"], "max_wait_ms must be a finite number"),
    (["--workers", "0"], "workers must be at least 1"),
    (["--max-body", "0"], "max_body"),
    (["--device", "cuda:7"], "--device cuda:7"),
])
def test_start_up_refuses_what_cannot_work_with_one_line_and_exit_2(store, capsys, flags, message):
    assert main(["serve", "--store", str(store.root), "--port", "0", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_an_empty_store_is_refused_at_start_up(tmp_path, capsys):
    assert main(["serve", "--store", str(tmp_path / "none"), "--port", "0"]) == 2
    assert "no adapters in" in capsys.readouterr().err


def test_importing_attnft_and_running_other_commands_never_imports_the_http_libraries(tmp_path):
    code = (
        "import sys\n"
        "import attnft, attnft.multitask, attnft.server.config\n"
        "from attnft.cli import main\n"
        f"assert main(['adapters', 'list', '--store', {str(tmp_path)!r}]) == 0\n"
        "http = ('uvicorn', 'starlette', 'prometheus_client', 'multipart', 'python_multipart', 'httpx')\n"
        "loaded = [m for m in http if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr


def test_the_serving_tutorials_curl_line_runs(server, tmp_path):
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    page = ROOT / "docs" / "tutorials" / "serve.md"
    line = next(line for line in page.read_text().splitlines() if line.startswith("curl "))
    image = re.search(r"@(\S+)", line).group(1)
    task = re.search(r"/v1/tasks/([^/]+)/classify", line).group(1)
    (tmp_path / image).write_bytes(png(150))
    command = line.replace("http://127.0.0.1:8000", server.url).replace(f"/tasks/{task}/", "/tasks/shirts/")
    result = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=REQUEST_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["task"] == "shirts" and answer["predictions"]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_half_precision_server_answers_the_top_1_of_fp32(store, offline, tmp_path, precision):
    """The base's fingerprint is taken from its float32 weights before the cast (a bf16 copy hashes to another, and
    every request was answered 503): over HTTP, every task's top-1 is fp32's on images that fp32 is sure of."""
    with Server(store, tmp_path, "--precision", precision, "--tasks", "shirts,shoes,lora-a") as half:
        agreed = checked = 0
        for task in ("shirts", "shoes", "lora-a"):
            for seed in range(12):
                expected = offline.probabilities(task, png(seed))
                response = half.classify(task, png(seed), top_k=1)
                assert response.status_code == 200, response.text
                top2 = expected.topk(2).values
                if top2[0] - top2[1] > 0.02:  # not a near tie, which half precision may flip
                    checked += 1
                    agreed += response.json()["predictions"][0]["index"] == int(expected.argmax())
        assert checked >= 10 and agreed == checked


# --- connections: every slow, idle or half-sent one is bounded (real sockets) ---------------------------------


@pytest.fixture(scope="module")
def strict(store, tmp_path_factory):
    with Server(store, tmp_path_factory.mktemp("strict"), "--tasks", "shirts", "--header-timeout", "1",
                "--timeout-keep-alive", "1", "--body-timeout", "2", "--graceful-timeout", "2",
                "--limit-concurrency", "8") as server:
        yield server


def _connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_within(sock, seconds: float, trickle: bytes = b"") -> float:
    """Seconds until the server closes ``sock`` (reading b"" or a reset), sending ``trickle`` a byte a 0.3 s; at most
    ``seconds``, else an AssertionError."""
    start = time.monotonic()
    sock.settimeout(0.3)
    sent = 0
    while time.monotonic() - start < seconds:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - start
        except socket.timeout:
            pass
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - start
        if sent < len(trickle):
            try:
                sock.send(trickle[sent:sent + 1])
            except (ConnectionResetError, BrokenPipeError):
                return time.monotonic() - start
            sent += 1
    raise AssertionError(f"the connection was still open after {seconds} s")


def _read_until_closed(sock, seconds: float) -> bytes:
    """What the server sends until it closes ``sock`` (a reply may come in several segments), at most ``seconds``."""
    data, deadline = b"", time.monotonic() + seconds
    sock.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def test_a_silent_connection_is_closed_after_the_header_timeout(strict):
    with _connect(strict) as sock:
        assert _closed_within(sock, 8) < 5


def test_a_slowloris_sending_a_header_byte_at_a_time_is_closed(strict):
    with _connect(strict) as sock:
        sock.send(b"GET /healthz HTTP/1.1\r\n")
        assert _closed_within(sock, 8, trickle=b"X-Slow: " + b"a" * 100) < 5


def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(strict):
    with _connect(strict) as sock:
        sock.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        assert _closed_within(sock, 8) < 5


def test_a_half_sent_body_gets_408_and_other_requests_are_served_meanwhile(strict):
    with _connect(strict) as sock:
        sock.send(b"POST /v1/tasks/shirts/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                  b"Content-Length: 5000\r\n\r\n" + png(3)[:100])
        assert strict.classify("shirts", png(4)).status_code == 200  # the half-sent body holds nobody else
        reply = _read_until_closed(sock, 15)
        assert reply.startswith(b"HTTP/1.1 408") and b"body_timeout" in reply, reply


def test_sigterm_stops_the_server_within_the_graceful_timeout_while_a_client_holds_a_half_sent_body(store, tmp_path):
    with Server(store, tmp_path, "--tasks", "shirts", "--graceful-timeout", "1", "--body-timeout", "600") as server:
        with _connect(server) as sock:
            sock.send(b"POST /v1/tasks/shirts/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                      b"Content-Length: 5000\r\n\r\n" + png(3)[:100])
            time.sleep(0.5)
            start = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            server.process.wait(timeout=30)
            assert time.monotonic() - start < 10 and server.process.returncode == 0


@pytest.mark.parametrize("flag, value, words", [("--header-timeout", "0", "header_timeout must be in (0"),
                                                ("--limit-concurrency", "0", "limit_concurrency must be from 1"),
                                                ("--graceful-timeout", "-1", "graceful_timeout must be in (0")])
def test_a_timeout_or_limit_out_of_range_is_one_line(capsys, store, flag, value, words):
    assert main(["serve", "--store", str(store.root), "--port", "0", flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err


def test_a_deeply_nested_json_body_is_a_400(server):
    response = server.client.post("/v1/tasks/shirts/classify", content=b"[" * 100_000 + b"]" * 100_000,
                                  headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["kind"] == "bad_json", response.text
    assert server.classify("shirts", png(11)).status_code == 200


def test_a_symlink_loop_or_a_link_out_of_the_store_is_not_served(store, tmp_path):
    import shutil

    local = AdapterStore(tmp_path / "store")
    shutil.copytree(store.path("shirts"), local.path("shirts"))
    shutil.copytree(store.path("shoes"), tmp_path / "elsewhere")
    (local.root / "loop").symlink_to(local.root / "loop")
    (local.root / "outside").symlink_to(tmp_path / "elsewhere")
    with Server(local, tmp_path) as served:
        names = [task["name"] for task in served.client.get("/v1/tasks").json()["tasks"]]
        assert names == ["shirts"]
        for name in ("loop", "outside"):
            assert served.classify(name, png(1)).status_code == 404
        assert served.classify("shirts", png(1)).status_code == 200
        assert "Traceback" not in served.stderr()


@pytest.mark.parametrize("flags, words", [(["--device", "meta"], "attnft serves on cpu, cuda, mps"),
                                          (["--host", "a" * 300], "is not a host name or address")])
def test_a_device_or_host_that_cannot_serve_is_one_line(capsys, store, flags, words):
    assert main(["serve", "--store", str(store.root), "--port", "0", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err
