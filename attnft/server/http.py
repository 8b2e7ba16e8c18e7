"""The HTTP API of ``attnft serve``, a Starlette app over a :class:`attnft.server.service.Service`.

    POST /v1/tasks/{task}/classify   an image as the body (image/png, image/jpeg, ...), multipart files,
                                     or JSON {"image": b64} / {"images": [b64, ...]}; top_k in the JSON,
                                     a form field or the query string
    GET  /v1/tasks                   every served task: base, classes, input size, format, loaded or not
    GET  /healthz                    liveness, queue depth
    GET  /metrics                    Prometheus metrics

The event loop parses, looks the task up once (a few stats of its folder; a changed config is read in the
pool) and awaits: decoding and preprocessing run in the service's thread pool, the model in its own thread
(:mod:`attnft.server.batcher`). Every refusal is JSON ``{"error": one line, "kind": ...}`` with a 4xx
status, or 503 (full queue, with ``Retry-After``; an adapter that cannot be served; a store whose folder
became a file; a request still running when a stop's ``--graceful-timeout`` ends); nothing a client sends
stops the server.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import TYPE_CHECKING, Optional

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartParser
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..core.errors import first_line
from .batcher import Answer, Job
from .catalog import StoreUnavailable, TaskEntry, UnknownTask
from .inputs import RequestError, check_top_k, parse_json_body

if TYPE_CHECKING:
    from .service import Service

logger = logging.getLogger(__name__)
RETRY_AFTER_S = 1
MAX_FORM_FIELDS = 16


def create_app(service: "Service") -> Starlette:
    """The app serving ``service``; its lifespan starts the model's thread and, at shutdown, drains it."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.batcher.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, service.close)

    routes = [
        Route("/v1/tasks/{task}/classify", functools.partial(classify, service), methods=["POST"]),
        Route("/v1/tasks", functools.partial(list_tasks, service), methods=["GET"]),
        Route("/healthz", functools.partial(healthz, service), methods=["GET"]),
        Route("/metrics", functools.partial(metrics, service), methods=["GET"]),
    ]
    handlers = {HTTPException: _http_error, Exception: _internal_error}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers,
                     middleware=[Middleware(EndsAtShutdown)])


class EndsAtShutdown:
    """ASGI middleware: a request still running when ``--graceful-timeout`` ends (a body that never finishes
    arriving, say) is cancelled by uvicorn, which would log the CancelledError's 50-line traceback as an error of
    the app. It answers 503 instead, if nothing was sent yet, and ends: uvicorn's one line says how many it cancelled.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        started = False

        async def tracked(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if scope["type"] != "http":
                raise
            asyncio.current_task().uncancel()  # ending is what the cancel asked for: this request ends here
            if not started:
                response = JSONResponse({"error": "the server stopped before this request finished", "kind": "stopped"},
                                        status_code=503, headers={"connection": "close"})
                await response(scope, receive, send)


async def classify(service: "Service", request: Request) -> Response:
    started = time.monotonic()
    task_label = "unknown"  # a label per name a client invents would grow the metrics without bound
    try:
        entry = await _lookup(service, request.path_params["task"])
        task_label = entry.name
        reason = service.pager.failure(entry)
        if reason is not None:
            raise RequestError(503, "adapter_unavailable", reason)
        body = await _read_body(request, service.max_body, service.body_timeout)
        images, top_k, batch = await _parse_body(request, body, service.batcher.max_queue)
        top_k = check_top_k(top_k, entry.num_classes)
        answers = await _classify(service, entry, images, top_k)
        response = JSONResponse(_answer_json(entry, answers, batch))
        service.metrics.images.labels(task_label).inc(len(images))
    except UnknownTask as e:
        response = _refuse(service, RequestError(404, "unknown_task", str(e)))
    except StoreUnavailable as e:
        response = _refuse(service, _store_unavailable(e))
    except RequestError as e:
        response = _refuse(service, e)
    service.metrics.requests.labels(task_label, str(response.status_code)).inc()
    service.metrics.latency.labels(task_label).observe(time.monotonic() - started)
    return response


async def _lookup(service: "Service", name: str) -> TaskEntry:
    """The entry of task ``name``: its folder looked at once, on the loop (a few stats: cheaper than a thread hop);
    the entry kept for it if unchanged, else its config read in the pool (a config, however large, is never read on
    the event loop). The entry goes with the request to the model's thread, which loads what it holds."""
    found = service.catalog.find(name)
    return found.entry if found.entry is not None else await service.run(service.catalog.read, found)


async def _classify(service: "Service", entry: TaskEntry, images: list[bytes], top_k: int) -> list[Answer]:
    """Reserve room, preprocess every image in the pool, queue them, await their answers."""
    batcher = service.batcher
    if len(images) > batcher.max_queue:
        raise RequestError(413, "too_many_images", f"{len(images)} images in one request, over --max-queue {batcher.max_queue}")
    if not batcher.reserve(len(images)):
        raise RequestError(503, "queue_full", f"the queue is full ({batcher.max_queue} images): retry in a moment",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
    submitted = False
    try:
        if len(images) == 1:
            tensors = [await service.run(service.preprocess, images[0], entry.data_config, "the image")]
        else:
            tensors = await asyncio.gather(*(service.run(service.preprocess, data, entry.data_config, f"image {i}")
                                             for i, data in enumerate(images)))
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in images]
        batcher.submit([Job(entry, tensor, top_k, functools.partial(_resolve, loop, future))
                        for tensor, future in zip(tensors, futures)])
        submitted = True
    finally:
        if not submitted:
            batcher.release(len(images))
    answers = await asyncio.gather(*futures)
    failed = next((a for a in answers if a.error is not None), None)
    if failed is not None:
        raise RequestError(failed.status, failed.kind, failed.error)
    return answers


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future, answer: Answer) -> None:
    """Called on the model's thread: hand ``answer`` to the request's loop."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(lambda: future.done() or future.set_result(answer))


def _answer_json(entry: TaskEntry, answers: list[Answer], batch: bool) -> dict:
    served = answers[0].entry or entry  # the version that answered (a store write may have replaced it)
    results = [[{"label": served.label(index), "index": index, "probability": probability}
                for index, probability in answer.predictions] for answer in answers]
    body = {
        "task": served.name,
        "adapter": {"name": served.name, "weights_sha256": served.weights_sha256, "format": served.format_name},
        "base": {"model": served.base.model_name, "input_size": served.base.input_size},
    }
    if batch:
        body["results"] = [{"predictions": predictions} for predictions in results]
    else:
        body["predictions"] = results[0]
    return body


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, at most ``limit`` bytes (413 beyond, told by Content-Length or counted as it arrives), within
    ``timeout_s`` seconds (408 beyond: a client that sends half a body never holds the server)."""
    too_large = RequestError(413, "too_large", f"the body is over --max-body ({limit} bytes)")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except ClientDisconnect:
        raise RequestError(400, "disconnected", "the client went away before sending the whole body") from None
    except TimeoutError:
        raise RequestError(408, "body_timeout", f"the body did not arrive within --body-timeout ({timeout_s:g} s)",
                           headers={"connection": "close"}) from None
    return b"".join(chunks)


async def _parse_body(request: Request, body: bytes, max_files: int) -> tuple[list[bytes], Optional[object], bool]:
    """(images, top_k as sent, batch form?) of a raw image, multipart or JSON body."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    query_top_k = request.query_params.get("top_k")
    if kind == "application/json":
        images, top_k, batch = parse_json_body(body)
        return images, top_k if top_k is not None else query_top_k, batch
    if kind == "multipart/form-data":
        images, top_k = await _parse_multipart(request, body, max_files)
        return images, top_k if top_k is not None else query_top_k, len(images) > 1
    if kind.startswith("image/") or kind in ("", "application/octet-stream"):
        return [body], query_top_k, False
    raise RequestError(415, "unsupported_media_type", f"cannot read a {kind} body: send the image itself (image/png, "
                       "image/jpeg, ...), multipart/form-data files, or JSON {\"image\": \"<base64>\"}")


async def _parse_multipart(request: Request, body: bytes, max_files: int) -> tuple[list[bytes], Optional[str]]:
    async def stream():
        yield body

    parser = MultiPartParser(request.headers, stream(), max_files=max_files, max_fields=MAX_FORM_FIELDS)
    try:
        form = await parser.parse()
    except Exception as e:  # noqa: BLE001  MultiPartException, and whatever else a malformed body makes it raise
        raise RequestError(400, "bad_multipart", f"the multipart body cannot be read: {first_line(e)}") from None
    try:
        images = [await value.read() for _, value in form.multi_items() if isinstance(value, UploadFile)]
        top_k = form.get("top_k")
    finally:
        await form.close()
    if not images:
        raise RequestError(400, "missing_field", "the multipart body has no file: send the image as a file field")
    return images, top_k if isinstance(top_k, str) else None


async def list_tasks(service: "Service", request: Request) -> Response:
    try:
        entries = await service.run(service.catalog.refresh)
    except StoreUnavailable as e:
        return _refuse(service, _store_unavailable(e))
    return JSONResponse({"tasks": [service.task_info(entry) for entry in entries]})


def _store_unavailable(error: StoreUnavailable) -> RequestError:
    """The store gone from under the server: the server's problem, not the request's (503, one line)."""
    return RequestError(503, "store_unavailable", str(error), headers={"Retry-After": str(RETRY_AFTER_S)})


async def healthz(service: "Service", request: Request) -> Response:
    return JSONResponse({"status": "ok", "queued": service.batcher.depth, "loaded": service.pager.loaded_count()})


async def metrics(service: "Service", request: Request) -> Response:
    return Response(service.metrics.render(), media_type=service.metrics.content_type)


def _refuse(service: "Service", error: RequestError) -> Response:
    service.metrics.errors.labels(error.kind).inc()
    return JSONResponse({"error": error.message, "kind": error.kind}, status_code=error.status, headers=error.headers)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return JSONResponse({"error": str(exc.detail), "kind": "http"}, status_code=exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    logger.exception("request %s %s failed", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"error": f"internal error: {first_line(exc)}", "kind": "internal"}, status_code=500)
