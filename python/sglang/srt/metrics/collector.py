"""Prometheus metrics (--enable-metrics, /metrics) under SGLang's names.

Request metrics are recorded in the tokenizer manager as results arrive, as in SGLang; the
scheduler's gauges and step-time histogram come from a SchedulerLoad fetched for each scrape.
Ours where SGLang has no name: sglang:num_aborted_requests_total carries a `reason` label (the
abort's err_type), and sglang:step_time_seconds / sglang:num_failed_steps_total describe steps.
With several HTTP workers (--tokenizer-worker-num) the launcher sets PROMETHEUS_MULTIPROC_DIR, as
SGLang does: every worker's request metrics live in files there, and a scrape of any worker sums
them (prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import os
from typing import Iterator, Optional, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


class SchedulerLoad(Protocol):
    """What a scrape exports of the scheduler's state (managers.io_struct.SchedulerLoad): the
    LOAD_GAUGES fields, read by name, and these."""

    num_failed_steps: int
    step_time_buckets: list[float]  # upper bounds
    step_time_counts: list[int]  # cumulative count per bound, +Inf last
    step_time_sum: float


TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2.5, 5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
# Tokens per target step of a speculating request: 1 (nothing accepted) to a verify's full width.
SPEC_ACCEPT_LENGTH_BUCKETS = (1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 8, 10, 12, 16)

# SchedulerLoad field -> (metric name, help)
LOAD_GAUGES = {
    "num_running_reqs": ("sglang:num_running_reqs", "The number of running requests."),
    "num_queue_reqs": ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    "token_usage": ("sglang:token_usage", "The token usage: KV tokens held by requests / KV capacity."),
    "num_used_tokens": ("sglang:num_used_tokens", "KV tokens held by requests."),
    "num_evictable_tokens": ("sglang:num_evictable_tokens", "KV tokens of cached prefixes no request holds."),
    "max_total_num_tokens": ("sglang:max_total_num_tokens", "KV cache capacity in tokens."),
    "req_slots_free": ("sglang:num_free_req_slots", "Request slots free for admission."),
    "num_grammar_queue_reqs": ("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."),
    "gen_throughput": ("sglang:gen_throughput", "The generation throughput (token/s)."),
    "cache_hit_rate": ("sglang:cache_hit_rate", "The prefix cache hit rate."),
}
# SGLang's speculative-decoding gauge: the mean accepted draft length, 0 without a draft model.
SPEC_ACCEPT_LENGTH = ("sglang:spec_accept_length", "The average acceptance length of speculative decoding.")


class SchedulerLoadCollector:
    """Exports the SchedulerLoad last set (a custom collector: the values live in the scheduler)."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.load: Optional[SchedulerLoad] = None

    def collect(self) -> Iterator[Metric]:
        load = self.load
        if load is None:
            return
        names, values = list(self.labels), list(self.labels.values())
        for field, (name, doc) in LOAD_GAUGES.items():
            gauge = GaugeMetricFamily(name, doc, labels=names)
            gauge.add_metric(values, float(getattr(load, field)))
            yield gauge
        spec = GaugeMetricFamily(*SPEC_ACCEPT_LENGTH, labels=names)
        spec.add_metric(values, 0.0)
        yield spec
        failed = CounterMetricFamily("sglang:num_failed_steps", "Scheduler steps that raised (their requests aborted).", labels=names)
        failed.add_metric(values, load.num_failed_steps)
        yield failed
        steps = HistogramMetricFamily("sglang:step_time_seconds", "Scheduler step time, submit to result.", labels=names)
        bounds = [str(b) for b in load.step_time_buckets] + ["+Inf"]
        steps.add_metric(values, list(zip(bounds, load.step_time_counts)), load.step_time_sum)
        yield steps


class TokenizerMetricsCollector:
    """The request metrics and the registry /metrics renders."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        self.label_values = labels
        names = list(labels)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", names, registry=self.registry)
        self.generation_tokens = Counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", names, registry=self.registry
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens", "Number of prompt tokens served from the prefix cache.", names, registry=self.registry
        )
        self.requests = Counter("sglang:num_requests", "Number of requests processed.", names, registry=self.registry)
        self.aborted = Counter(
            "sglang:num_aborted_requests", "Number of requests aborted, by reason (the abort's err_type).",
            names + ["reason"], registry=self.registry,
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", names,
            buckets=TTFT_BUCKETS, registry=self.registry,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", names,
            buckets=ITL_BUCKETS, registry=self.registry,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", names,
            buckets=E2E_BUCKETS, registry=self.registry,
        )
        self.spec_accept_length = Histogram(
            "sglang:spec_accept_length_per_request",
            "Histogram of each finished request's speculative acceptance length (tokens per target step).", names,
            buckets=SPEC_ACCEPT_LENGTH_BUCKETS, registry=self.registry,
        )
        self.scheduler = SchedulerLoadCollector(labels)
        self._rendered = self.registry
        if os.environ.get(MULTIPROC_DIR_ENV):
            self._rendered = CollectorRegistry()  # every worker's files, summed
            MultiProcessCollector(self._rendered, path=os.environ[MULTIPROC_DIR_ENV])
        self._rendered.register(self.scheduler)

    def first_token(self, seconds: float) -> None:
        self.ttft.labels(**self.label_values).observe(seconds)

    def later_tokens(self, seconds: float, count: int) -> None:
        """`count` tokens arrived `seconds` after the previous ones: SGLang observes the mean gap."""
        self.itl.labels(**self.label_values).observe(seconds / count)

    def finished(
        self, prompt_tokens: int, completion_tokens: int, e2e_seconds: float, reason: dict, cached_tokens: int = 0
    ) -> None:
        labels = self.label_values
        self.requests.labels(**labels).inc()
        self.prompt_tokens.labels(**labels).inc(prompt_tokens)
        self.cached_tokens.labels(**labels).inc(cached_tokens)
        self.generation_tokens.labels(**labels).inc(completion_tokens)
        self.e2e.labels(**labels).observe(e2e_seconds)
        if reason.get("type") == "abort":
            self.aborted.labels(**labels, reason=str(reason.get("err_type", "unknown"))).inc()

    def spec_finished(self, accept_length: float) -> None:
        self.spec_accept_length.labels(**self.label_values).observe(accept_length)

    def render(self, load: SchedulerLoad) -> bytes:
        self.scheduler.load = load
        return generate_latest(self._rendered)
