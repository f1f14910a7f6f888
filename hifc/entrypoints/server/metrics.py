"""Prometheus metrics: the engine's counters and gauges, plus request latency histograms.

Each server has its own ``CollectorRegistry`` (no process-global state). Engine values are read
from the stats snapshot the engine thread publishes, at scrape time; the histograms are fed by
the engine thread as requests produce their first token and finish. With data parallelism the
engine values are the replicas' sums, and each replica's and each shared flash device's own
values come labelled (``replica``, ``device``).
"""
from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "hifc"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)

# (stats key, metric name, help)
_GAUGES = (
    ("running", "num_requests_running", "Requests in the running batch"),
    ("waiting", "num_requests_waiting", "Requests waiting to be admitted"),
    ("swapped", "num_requests_swapped", "Preempted requests whose KV is in (or moving to or "
                                        "from) the swap tier"),
    ("gpu_blocks_free", "gpu_kv_blocks_free", "Free KV blocks on the device"),
    ("gpu_blocks_total", "gpu_kv_blocks_total", "KV blocks on the device"),
    ("gpu_blocks_cached", "gpu_kv_blocks_cached",
     "Free KV blocks on the device that still hold a cached prefix (counted as free)"),
    ("tier_blocks_used", "tier_blocks_used", "Swap tier blocks in use"),
    ("tier_blocks_total", "tier_blocks_total", "Swap tier blocks (0 without a tier)"),
    ("swap_jobs_pending", "swap_jobs_pending", "Swap I/O jobs in flight"),
)
_COUNTERS = (
    ("prompt_tokens", "prompt_tokens", "Prompt tokens of the requests admitted"),
    ("generation_tokens", "generation_tokens", "Tokens generated"),
    ("prefix_cache_queries", "prefix_cache_queries",
     "Tokens of the sequences admitted, looked up in the GPU prefix cache"),
    ("prefix_cache_hits", "prefix_cache_hits",
     "Of the prefix cache queries, tokens found cached (their prefill skipped)"),
    ("preemptions", "preemptions", "Sequences preempted"),
    ("recomputed_sequences", "recomputed_sequences", "Preempted sequences recomputed"),
    ("swap_failures", "swap_failures", "Swaps that failed and fell back to recompute"),
    ("swap_out_blocks", "swap_out_blocks", "KV blocks swapped out to the tier"),
    ("swap_in_blocks", "swap_in_blocks", "KV blocks swapped in from the tier"),
    ("tier_bytes_written", "tier_bytes_written", "Bytes written to the swap tier"),
    ("tier_bytes_read", "tier_bytes_read", "Bytes read from the swap tier"),
    ("swap_io_seconds", "swap_io_seconds", "Seconds spent in swap I/O"),
    ("swap_stall_seconds", "swap_stall_seconds", "Seconds steps waited for swap I/O"),
    ("swap_out_stall_seconds", "swap_out_stall_seconds",
     "Of the swap stall, seconds waited for GPU blocks held by swap-out writes"),
)


# per replica, labelled: (stats key, metric name, help, counter?)
_REPLICA_METRICS = (
    ("running", "replica_requests_running", "Requests in the replica's running batch", False),
    ("gpu_blocks_free", "replica_gpu_kv_blocks_free", "Free KV blocks on the replica's device",
     False),
    ("generation_tokens", "replica_generation_tokens", "Tokens the replica generated", True),
    ("preemptions", "replica_preemptions", "Sequences the replica preempted", True),
    ("tier_bytes_written", "replica_tier_bytes_written", "Bytes the replica wrote to its tier",
     True),
    ("tier_bytes_read", "replica_tier_bytes_read", "Bytes the replica read from its tier", True),
    ("swap_stall_seconds", "replica_swap_stall_seconds",
     "Seconds the replica's steps waited for swap I/O", True),
    ("arbiter_swap_in_wait_seconds", "replica_arbiter_swap_in_wait_seconds",
     "Seconds the replica's swap-in reads waited for the shared flash device", True),
    ("arbiter_swap_out_wait_seconds", "replica_arbiter_swap_out_wait_seconds",
     "Seconds the replica's swap-out writes waited for the shared flash device", True),
)
# per shared flash device, labelled
_DEVICE_METRICS = (
    ("inflight_bytes", "flash_device_inflight_bytes",
     "Bytes of I/O in flight on the shared flash device", False),
    ("measured_gibps", "flash_device_measured_gibps",
     "The shared flash device's rate while busy, GiB/s", False),
    ("swap_in_bytes", "flash_device_swap_in_bytes", "Swap-in bytes admitted on the device", True),
    ("swap_out_bytes", "flash_device_swap_out_bytes", "Swap-out bytes admitted on the device",
     True),
    ("swap_in_wait_seconds", "flash_device_swap_in_wait_seconds",
     "Seconds swap-ins waited for admission on the device", True),
    ("swap_out_wait_seconds", "flash_device_swap_out_wait_seconds",
     "Seconds swap-outs waited for admission on the device", True),
)


def _labelled(rows: list[dict], label: str, label_key: str, table) -> Iterator[Metric]:
    """One family per metric of ``table``, one sample per row that has its key."""
    for key, name, doc, counter in table:
        kind = CounterMetricFamily if counter else GaugeMetricFamily
        family = kind(f"{PREFIX}_{name}", doc, labels=[label])
        for row in rows:
            if row.get(key) is not None:
                family.add_metric([str(row[label_key])], row[key])
        yield family


class _EngineStatsCollector(Collector):
    def __init__(self, read_stats: Callable[[], dict]):
        self._read_stats = read_stats

    def collect(self) -> Iterator[Metric]:
        stats = self._read_stats()
        for key, name, doc in _GAUGES:
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=stats.get(key, 0))
        total, free = stats.get("gpu_blocks_total", 0), stats.get("gpu_blocks_free", 0)
        yield GaugeMetricFamily(f"{PREFIX}_gpu_kv_cache_usage_ratio",
                                "Fraction of device KV blocks in use (0..1)",
                                value=(total - free) / total if total else 0.0)
        tier_total = stats.get("tier_blocks_total", 0)
        yield GaugeMetricFamily(f"{PREFIX}_tier_usage_ratio",
                                "Fraction of swap tier blocks in use (0..1)",
                                value=stats.get("tier_blocks_used", 0) / tier_total
                                if tier_total else 0.0)
        for key, name, doc in _COUNTERS:
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=stats.get(key, 0))
        if "replicas" in stats:
            yield from _labelled(stats["replicas"], "replica", "replica", _REPLICA_METRICS)
            yield from _labelled(stats["flash_devices"], "device", "device", _DEVICE_METRICS)


class ServerMetrics:
    """The registry of one server; also the engine thread's RequestObserver."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"model_name": model_name}
        self._ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds",
                               "Time from arrival to the first generated token",
                               list(labels), buckets=_LATENCY_BUCKETS,
                               registry=self.registry).labels(**labels)
        self._tpot = Histogram(f"{PREFIX}_time_per_output_token_seconds",
                               "Mean time per output token after the first, per request",
                               list(labels), buckets=_TPOT_BUCKETS,
                               registry=self.registry).labels(**labels)
        self._e2e = Histogram(f"{PREFIX}_e2e_request_latency_seconds",
                              "Time from arrival to the last token", list(labels),
                              buckets=_E2E_BUCKETS, registry=self.registry).labels(**labels)
        self._finished = Counter(f"{PREFIX}_request_success",
                                 "Requests that finished, by finish reason",
                                 ["model_name", "finished_reason"], registry=self.registry)
        self._model_name = model_name

    def export_engine_stats(self, read_stats: Callable[[], dict]) -> None:
        """Export the engine's counters and gauges, read by ``read_stats`` at each scrape."""
        self.registry.register(_EngineStatsCollector(read_stats))

    def on_first_token(self, ttft_s: float) -> None:
        self._ttft.observe(ttft_s)

    def on_finished(self, finish_reason: str | None, e2e_s: float,
                    time_per_output_token_s: float | None) -> None:
        self._e2e.observe(e2e_s)
        if time_per_output_token_s is not None:
            self._tpot.observe(time_per_output_token_s)
        self._finished.labels(model_name=self._model_name,
                              finished_reason=finish_reason or "unknown").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
