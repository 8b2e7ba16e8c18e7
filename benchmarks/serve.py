"""``attnft serve`` under load (issue 22): throughput, latency and batch size of mixed-task batching against
batch size 1, and the memory of N tasks on one backbone against N separate models.

A store of adapters is made on the bundled ``vit_fmnist_patch4_28`` (28 px, 307k parameters;
each adapter its attention, head and position embedding moved, as the ``attn`` policy trains
them). A real ``attnft serve`` process runs on localhost; a bounded asyncio client keeps
``--clients`` requests in flight (one keep-alive connection each), each a PNG of the bundled
Fashion-MNIST sample for one of ``--tasks`` tasks in turn, ``--requests`` per row. The same
load runs against ``--max-batch 32`` (mixed batching) and ``--max-batch 1``. Client and server
share the machine's cores, so two clients are measured: httpx's AsyncClient, and raw HTTP/1.1
on asyncio streams, which costs the cores about a tenth of httpx's per request and so shows
the server's own capacity (on 2 cores httpx's client spends more CPU per request than the server).

Memory: the resident set (RSS) of a fresh process holding N tasks on one backbone
(``MultiTaskModel.from_store``) against N separate merged models (``AdapterStore.load`` on a
base each), above the same process after its imports; and the serving process itself with N
tasks loaded.

    PYTHONPATH=. python benchmarks/serve.py --out benchmarks/results      # -> serve.json, serve.md
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import ctypes
import gc
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: idle OpenMP threads sleep (see attnft/cli.py)

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASE = "vit_fmnist_patch4_28"


def make_store(root: Path, count: int) -> None:
    from attnft.methods.freeze.snapshot import BaseSnapshot
    from attnft.models import create_model
    from attnft.methods.freeze.policy import apply_policy
    from attnft.adapters.store import AdapterStore

    store = AdapterStore(root)
    base = create_model(BASE)
    for i in range(count):
        model = copy.deepcopy(base)
        report = apply_policy(model, "attn")
        snapshot = BaseSnapshot.capture(model, report)
        generator = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for param in (p for p in model.parameters() if p.requires_grad):
                param.add_(0.02 * torch.randn(param.shape, generator=generator))
        store.save(f"task{i:02d}", model, report, snapshot)


def sample_pngs(count: int) -> list[bytes]:
    from attnft.data.fashion_mnist import read_fashion_mnist

    images, _ = read_fashion_mnist("test")
    out = []
    for array in images[:count]:
        buffer = io.BytesIO()
        Image.fromarray(np.asarray(array, dtype=np.uint8)).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


@contextlib.contextmanager
def serving(store: Path, tasks: list[str], *flags: str):
    """An ``attnft serve`` process; yields (url, pid)."""
    log = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(log / "out", "w") as out, open(log / "err", "w") as err:
        process = subprocess.Popen([sys.executable, "-m", "attnft", "serve", "--store", str(store), "--port", "0",
                                    "--tasks", ",".join(tasks), *flags], stdout=out, stderr=err, env=env)
    try:
        deadline = time.monotonic() + 180
        url = None
        while url is None:
            match = re.search(r"http://127\.0\.0\.1:\d+", (log / "out").read_text())
            url = match.group(0) if match else None
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {(log / 'err').read_text()[-2000:]}")
            time.sleep(0.1)
        while True:
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE))


async def load(url: str, tasks: list[str], images: list[bytes], clients: int, requests: int, kind: str = "httpx") -> dict:
    """``requests`` classify calls with ``clients`` in flight, each client one keep-alive connection; latency per
    call, errors, wall time. ``kind``: httpx (an AsyncClient per client: one client's pool shared by 32 connections
    costs more than the server), or ``raw`` HTTP/1.1 on asyncio streams (a tenth of httpx's CPU per request, so the
    server's own capacity shows)."""
    latencies: list[float] = []
    errors = 0
    counter = iter(range(requests))

    async def worker():
        nonlocal errors
        async with contextlib.AsyncExitStack() as stack:
            post = await (_raw_poster(url, stack) if kind == "raw" else _httpx_poster(url, stack))
            for i in counter:
                task, data = tasks[i % len(tasks)], images[i % len(images)]
                started = time.perf_counter()
                status = await post(f"/v1/tasks/{task}/classify", data)
                latencies.append(time.perf_counter() - started)
                errors += status != 200

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - started
    latencies.sort()

    def pct(q):
        return 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {"requests": requests, "clients": clients, "seconds": wall, "requests_per_s": requests / wall,
            "p50_ms": pct(0.50), "p95_ms": pct(0.95), "p99_ms": pct(0.99), "errors": errors}


async def _httpx_poster(url: str, stack: contextlib.AsyncExitStack):
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=60, limits=limits))

    async def post(path: str, data: bytes) -> int:
        response = await client.post(path, content=data, headers={"content-type": "image/png"})
        return response.status_code

    return post


async def _raw_poster(url: str, stack: contextlib.AsyncExitStack):
    host, port = url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    stack.callback(writer.close)

    async def post(path: str, data: bytes) -> int:
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: image/png\r\nContent-Length: {len(data)}\r\n\r\n"
        writer.write(head.encode() + data)
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        await reader.readexactly(length)
        return status

    return post


def throughput(store: Path, tasks: list[str], images: list[bytes], args) -> list[dict]:
    """Both servers run at once and every row alternates between them, ``--repeats`` times (the median kept), so
    that other jobs on the machine slow both alike."""
    rows = []
    configs = (args.max_batch, 1)
    with contextlib.ExitStack() as stack:
        urls = {size: stack.enter_context(serving(store, tasks, "--max-batch", str(size), "--max-wait-ms",
                                                  str(args.max_wait_ms)))[0] for size in configs}
        for url in urls.values():
            asyncio.run(load(url, tasks, images, 4, 8 * len(tasks)))  # every adapter loaded, every path warm
        for kind in args.client:
            for clients in args.clients:
                runs: dict[int, list[dict]] = {size: [] for size in configs}
                for _ in range(args.repeats):
                    for size, url in urls.items():
                        count0, sum0 = metric(url, "attnft_batch_size_count"), metric(url, "attnft_batch_size_sum")
                        run = asyncio.run(load(url, tasks, images, clients, args.requests, kind))
                        batches = metric(url, "attnft_batch_size_count") - count0
                        run["mean_batch"] = (metric(url, "attnft_batch_size_sum") - sum0) / max(batches, 1)
                        runs[size].append(run)
                for size in configs:
                    row = sorted(runs[size], key=lambda r: r["requests_per_s"])[len(runs[size]) // 2]
                    row.update(client=kind, max_batch=size, repeats=[r["requests_per_s"] for r in runs[size]],
                               errors=sum(r["errors"] for r in runs[size]),
                               requests=sum(r["requests"] for r in runs[size]))
                    rows.append(row)
                    print(f"  {kind:>5} client, max-batch {size:>2}, {clients:>2} clients: {row['requests_per_s']:7.1f} "
                          f"req/s, p50 {row['p50_ms']:6.1f} ms, p99 {row['p99_ms']:6.1f} ms, mean batch "
                          f"{row['mean_batch']:5.1f}, errors {row['errors']}", flush=True)
    return rows


def model_ceiling(store: Path, tasks: list[str], batch: int, reps: int = 15) -> dict:
    """The model alone: one image per call against ``batch`` images of every task mixed, per image (interleaved,
    median): how much batching can gain when nothing but the model costs."""
    from attnft.models import create_model
    from attnft.multitask import MultiTaskModel
    from attnft.adapters.store import AdapterStore

    served = MultiTaskModel.from_store(AdapterStore(store), tasks, base_model=create_model(BASE))
    x = torch.randn(batch, 3, 28, 28)
    mixed = [tasks[i % len(tasks)] for i in range(batch)]
    single, batched = [], []
    served(x, tasks=mixed)  # warm-up
    for _ in range(reps):
        started = time.perf_counter()
        for task in tasks:
            served(x[:1], task=task)
        single.append((time.perf_counter() - started) / len(tasks))
        started = time.perf_counter()
        served(x, tasks=mixed)
        batched.append((time.perf_counter() - started) / batch)
    one, many = sorted(single)[reps // 2], sorted(batched)[reps // 2]
    return {"batch": batch, "ms_per_image_batch_1": 1000 * one, "ms_per_image_mixed_batch": 1000 * many,
            "speedup": one / many}


def rss_bytes(pid: str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settle() -> None:
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_child(store: str, kind: str, count: int) -> None:
    """In a fresh process: RSS above the imports of ``count`` tasks, on one backbone or as separate models."""
    from attnft.models import create_model
    from attnft.multitask import MultiTaskModel
    from attnft.adapters.store import AdapterStore

    adapters = AdapterStore(store)
    names = adapters.names()[:count]
    settle()
    start = rss_bytes()
    if kind == "multitask":
        held = [MultiTaskModel.from_store(adapters, names, base_model=create_model(BASE))]
    else:
        held = []
        for name in names:
            model = create_model(BASE)
            adapters.load(name, model)
            held.append(model.eval())
    settle()
    print(json.dumps({"rss_mb": (rss_bytes() - start) / 2**20, "held": len(held)}))


def memory(store: Path, counts: list[int], images: list[bytes]) -> list[dict]:
    rows = []
    for count in counts:
        row = {"tasks": count}
        for kind in ("multitask", "separate"):
            cmd = [sys.executable, __file__, "--rss-child", str(store), kind, str(count)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            row[f"{kind}_rss_mb"] = json.loads(out.stdout.strip().splitlines()[-1])["rss_mb"]
        row["ratio"] = row["multitask_rss_mb"] / row["separate_rss_mb"]
        tasks = [f"task{i:02d}" for i in range(count)]
        with serving(store, tasks) as (url, pid):
            idle = rss_bytes(str(pid))
            asyncio.run(load(url, tasks, images, 4, len(tasks)))  # each task once: every adapter loaded
            row["server_rss_mb"] = rss_bytes(str(pid)) / 2**20
            row["server_rss_above_idle_mb"] = (rss_bytes(str(pid)) - idle) / 2**20
            row["server_resident_tensor_mb"] = metric(url, "attnft_resident_bytes") / 2**20
        rows.append(row)
        print(f"  {count} tasks: one backbone {row['multitask_rss_mb']:.1f} MB, separate models "
              f"{row['separate_rss_mb']:.1f} MB ({row['ratio']:.2f}x); server {row['server_rss_mb']:.0f} MB", flush=True)
    return rows


def markdown(result: dict) -> str:
    lines = [f"`attnft serve`, {result['tasks']} tasks of `{BASE}` (28 px), CPU ({result['cpus']} cores shared by client, "
             f"server and other jobs), {result['requests']} requests per run, the median of {result['repeats']} runs alternating "
             f"the two servers, `--max-wait-ms {result['max_wait_ms']:g}`", "",
             "| client | max batch | clients | requests/s | p50 ms | p95 ms | p99 ms | mean batch | errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in sorted(result["throughput"], key=lambda r: (r["client"], -r["max_batch"], r["clients"])):
        lines.append(f"| {row['client']} | {row['max_batch']} | {row['clients']} | {row['requests_per_s']:.1f} | "
                     f"{row['p50_ms']:.1f} | {row['p95_ms']:.1f} | {row['p99_ms']:.1f} | {row['mean_batch']:.1f} | {row['errors']} |")
    ratios = ", ".join(f"{kind} client **{ratio:.2f}x**" for kind, ratio in result["ratio_at_max_clients"].items())
    alone = result["model_alone"]
    lines += ["", f"Requests/s of mixed batching over batch size 1 at {max(result['levels'])} clients: {ratios}. The model "
              f"alone: {alone['ms_per_image_batch_1']:.2f} ms per image one at a time, {alone['ms_per_image_mixed_batch']:.2f} ms "
              f"in mixed batches of {alone['batch']} ({alone['speedup']:.2f}x, the most batching can gain here).", "",
              "| tasks | RSS, one backbone (MB) | RSS, separate models (MB) | ratio | server RSS (MB) | "
              "server tensors (MB) |", "|---:|---:|---:|---:|---:|---:|"]
    for row in result["memory"]:
        lines.append(f"| {row['tasks']} | {row['multitask_rss_mb']:.1f} | {row['separate_rss_mb']:.1f} | {row['ratio']:.2f}x | "
                     f"{row['server_rss_mb']:.0f} | {row['server_resident_tensor_mb']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=700, help="requests per run (each row: --repeats runs)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row, alternating the two servers")
    parser.add_argument("--max-batch", type=int, default=32, help="the mixed-batching server's --max-batch")
    parser.add_argument("--client", nargs="+", choices=("httpx", "raw"), default=["httpx", "raw"],
                        help="load generators: httpx's AsyncClient, and raw HTTP/1.1 on asyncio streams")
    parser.add_argument("--max-wait-ms", type=float, default=0.0, help="the mixed-batching server's (attnft serve's default: 0)")
    parser.add_argument("--memory-tasks", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--out", default=None, help="folder for serve.json and serve.md")
    parser.add_argument("--rss-child", nargs=3, metavar=("STORE", "KIND", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child(args.rss_child[0], args.rss_child[1], int(args.rss_child[2]))
        return
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        store = Path(tmp) / "adapters"
        make_store(store, max(args.tasks, *args.memory_tasks))
        images = sample_pngs(256)
        tasks = [f"task{i:02d}" for i in range(args.tasks)]
        ceiling = model_ceiling(store, tasks, args.max_batch)
        print(f"  the model alone: {ceiling['ms_per_image_batch_1']:.2f} ms per image one at a time, "
              f"{ceiling['ms_per_image_mixed_batch']:.2f} in mixed batches of {args.max_batch}: "
              f"{ceiling['speedup']:.2f}x", flush=True)
        rows = throughput(store, tasks, images, args)
        top = max(args.clients)
        rate = {(r["client"], r["max_batch"]): r["requests_per_s"] for r in rows if r["clients"] == top}
        result = {"tasks": args.tasks, "levels": args.clients, "requests": args.requests, "max_wait_ms": args.max_wait_ms,
                  "max_batch": args.max_batch, "cpus": os.cpu_count(), "torch": torch.__version__,
                  "load_average": os.getloadavg(), "repeats": args.repeats, "model_alone": ceiling, "throughput": rows,
                  "ratio_at_max_clients": {kind: rate[kind, args.max_batch] / rate[kind, 1] for kind in args.client},
                  "memory": memory(store, args.memory_tasks, images)}
    text = markdown(result)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "serve.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "serve.md").write_text(text)


if __name__ == "__main__":
    main()
