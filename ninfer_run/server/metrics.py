"""Prometheus metrics at /metrics, named like vLLM's so existing Grafana dashboards work unchanged.

Per-request figures are observed when the engine finishes a request (engine thread; the client
library is thread-safe); pool, queue and acceptance gauges are read from the engine at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..engine import Engine, Result

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
_TOKENS_PER_S = (1, 5, 10, 20, 40, 60, 80, 100, 125, 150, 200, 300, 500, 1000)


class _EngineGauges:
    """Gauges read from the engine when Prometheus scrapes."""

    def __init__(self, engine: Engine, model_name: str):
        self.engine, self.model_name = engine, model_name

    def collect(self):
        c = self.engine.counters()
        label = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(label, value)
            return g

        yield gauge("vllm:num_requests_running", "sequences admitted (prefilling or decoding)",
                    c["prefilling"] + c["decoding"])
        yield gauge("vllm:num_requests_waiting", "requests waiting for admission", c["queue_depth"])
        yield gauge("vllm:kv_cache_usage_perc", "fraction of KV pool blocks in use (running + prefix frontiers)",
                    c["pool_used_blocks"] / max(1, c["pool_blocks"]))
        yield gauge("ninfer:kv_pool_blocks", "KV pool blocks in all", c["pool_blocks"])
        yield gauge("ninfer:kv_pool_used_blocks", "KV pool blocks in use (running + prefix frontiers)",
                    c["pool_used_blocks"])
        yield gauge("ninfer:prefix_frontiers", "prefix-cache frontiers resident", c["frontiers"])
        yield gauge("ninfer:spec_acceptance_rate", "MTP draft tokens accepted / drafted, since start",
                    c["spec_acceptance_rate"])
        media = self.engine.media
        if media is not None:
            yield gauge("ninfer:media_cache_bytes", "vision encoder outputs cached", media.cached_bytes)
            yield gauge("ninfer:media_cache_hits", "images served from the encoder cache, since start", media.hits)
            yield gauge("ninfer:media_encoded", "images run through the vision tower, since start", media.misses)


class Metrics:
    def __init__(self, engine: Engine, model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        r, m = self.registry, ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "submission to first token (queue + prefill)", m,
                              buckets=_SECONDS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "submission to admission", m, buckets=_SECONDS,
                               registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "submission to the end", m, buckets=_SECONDS,
                             registry=r)
        self.decode = Histogram("ninfer:decode_tokens_per_second", "per-request decode speed after the first token",
                                m, buckets=_TOKENS_PER_S, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "prompt tokens of finished requests", m, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "tokens generated", m, registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "prompt tokens looked up in the prefix cache", m,
                                      registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "prompt tokens served from the prefix cache", m,
                                   registry=r)
        self.drafted = Counter("vllm:spec_decode_num_draft_tokens", "MTP draft tokens proposed", m, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "MTP draft tokens accepted", m, registry=r)
        self.requests = Counter("ninfer:requests", "finished requests by finish reason", [*m, "finish_reason"],
                                registry=r)
        r.register(_EngineGauges(engine, model_name))
        engine.on_finish.append(self.observe)

    def observe(self, res: Result) -> None:
        name = self.model_name
        self.requests.labels(name, res.finish_reason).inc()
        self.e2e.labels(name).observe(max(0.0, (res.finished or res.submitted) - res.submitted))
        if res.admitted is None:
            return
        self.queue.labels(name).observe(max(0.0, res.admitted - res.submitted))
        self.prompt_tokens.labels(name).inc(res.prompt_tokens)
        self.prefix_queries.labels(name).inc(res.prompt_tokens)
        self.prefix_hits.labels(name).inc(res.cached_tokens)
        self.generation_tokens.labels(name).inc(len(res.tokens))
        self.drafted.labels(name).inc(res.drafted)
        self.accepted.labels(name).inc(res.accepted)
        if res.first_token is not None:
            self.ttft.labels(name).observe(res.first_token - res.submitted)
            decode_s = (res.finished or res.first_token) - res.first_token
            if len(res.tokens) > 1 and decode_s > 0:
                self.decode.labels(name).observe((len(res.tokens) - 1) / decode_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
