"""The server's Prometheus metrics, in a registry of their own (``GET /metrics``)."""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServeMetrics:
    """Requests, errors by kind, batch sizes, queue wait, latencies, adapters loaded and evicted."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("attnft_requests", "classify requests answered, by task and HTTP status",
                                ["task", "status"], registry=registry)
        self.images = Counter("attnft_images", "images classified, by task", ["task"], registry=registry)
        self.errors = Counter("attnft_errors", "refused or failed requests, by kind", ["kind"], registry=registry)
        self.latency = Histogram("attnft_request_seconds", "classify request latency, body read to answer",
                                 ["task"], buckets=TIME_BUCKETS, registry=registry)
        self.preprocess_seconds = Histogram("attnft_preprocess_seconds", "decoding and preprocessing one image",
                                            buckets=TIME_BUCKETS, registry=registry)
        self.queue_wait = Histogram("attnft_queue_wait_seconds", "time an image waits in the queue for its batch",
                                    buckets=TIME_BUCKETS, registry=registry)
        self.model_seconds = Histogram("attnft_batch_seconds", "time the model's thread spends on one batch "
                                       "(loading adapters included)", buckets=TIME_BUCKETS, registry=registry)
        self.batch_size = Histogram("attnft_batch_size", "images per batch, tasks mixed", buckets=BATCH_BUCKETS,
                                    registry=registry)
        self.batch_tasks = Histogram("attnft_batch_tasks", "tasks per batch", buckets=BATCH_BUCKETS, registry=registry)
        self.queue_depth = Gauge("attnft_queue_depth", "images queued, not yet in a batch", registry=registry)
        self.adapters_loaded = Gauge("attnft_adapters_loaded", "adapters loaded in a backbone", registry=registry)
        self.loads = Counter("attnft_adapter_loads", "adapters loaded (first use, reload after a store write, "
                             "or after an eviction)", registry=registry)
        self.evictions = Counter("attnft_adapter_evictions", "adapters unloaded to stay within the memory budget",
                                 registry=registry)
        self.resident_bytes = Gauge("attnft_resident_bytes", "tensor bytes of backbones and loaded adapters",
                                    registry=registry)
        self.budget_bytes = Gauge("attnft_memory_budget_bytes", "the memory budget (0: none)", registry=registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
