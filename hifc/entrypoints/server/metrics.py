"""Prometheus metrics: the engine's counters and gauges, plus request histograms.

Where a metric means what one of vLLM's means, it has vLLM's name and labels (``vllm:`` prefix,
``model_name``), so dashboards and load testers made for vLLM read it; what only hifc has (the
swap tier, swaps, the device block counts) is named ``hifc_...``. Each server has its own
``CollectorRegistry`` (no process-global state). Engine values are read from the stats snapshot
the engine thread publishes, at scrape time; the histograms are fed by the engine thread as
requests produce their first token and finish. With data parallelism the engine values are the
replicas' sums, and each replica's and each shared flash device's own values come labelled
(``replica``, ``device``); an engine in a process of its own (one replica) reports as one
engine in the server's process does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hifc.engine.outputs import RequestOutput

if TYPE_CHECKING:  # the observer's argument type; the engine thread's module imports torch
    from hifc.entrypoints.server.async_engine import FinishedRequest

VLLM = "vllm:"
HIFC = "hifc_"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
_N_BUCKETS = (1, 2, 5, 10, 20)

# (stats key, metric name, help)
_GAUGES = (
    ("running", f"{VLLM}num_requests_running", "Requests in the running batch"),
    ("waiting", f"{VLLM}num_requests_waiting", "Requests waiting to be admitted"),
    ("swapped", f"{HIFC}num_requests_swapped", "Preempted requests whose KV is in (or moving "
                                               "to or from) the swap tier"),
    ("gpu_blocks_free", f"{HIFC}gpu_kv_blocks_free", "Free KV blocks on the device"),
    ("gpu_blocks_total", f"{HIFC}gpu_kv_blocks_total", "KV blocks on the device"),
    ("gpu_blocks_cached", f"{HIFC}gpu_kv_blocks_cached",
     "Free KV blocks on the device that still hold a cached prefix (counted as free)"),
    ("tier_blocks_used", f"{HIFC}tier_blocks_used", "Swap tier blocks in use"),
    ("tier_blocks_total", f"{HIFC}tier_blocks_total", "Swap tier blocks (0 without a tier)"),
    ("swap_jobs_pending", f"{HIFC}swap_jobs_pending", "Swap I/O jobs in flight"),
    ("prefix_store_blocks", f"{HIFC}prefix_store_blocks",
     "KV blocks indexed in the flash prefix store now"),
)
_COUNTERS = (
    ("prompt_tokens", f"{VLLM}prompt_tokens", "Prompt tokens of the requests admitted"),
    ("generation_tokens", f"{VLLM}generation_tokens", "Tokens generated"),
    ("preemptions", f"{VLLM}num_preemptions", "Sequences preempted"),
    ("prefix_cache_queries", f"{VLLM}prefix_cache_queries",
     "Tokens of the sequences admitted, looked up in the GPU prefix cache"),
    ("prefix_cache_hits", f"{VLLM}prefix_cache_hits",
     "Of the prefix cache queries, tokens found cached (their prefill skipped)"),
    ("recomputed_sequences", f"{HIFC}recomputed_sequences", "Preempted sequences recomputed"),
    ("swap_failures", f"{HIFC}swap_failures", "Swaps that failed and fell back to recompute"),
    ("swap_out_blocks", f"{HIFC}swap_out_blocks", "KV blocks swapped out to the tier"),
    ("swap_in_blocks", f"{HIFC}swap_in_blocks", "KV blocks swapped in from the tier"),
    ("tier_bytes_written", f"{HIFC}tier_bytes_written", "Bytes written to the swap tier"),
    ("tier_bytes_read", f"{HIFC}tier_bytes_read", "Bytes read from the swap tier"),
    ("swap_io_seconds", f"{HIFC}swap_io_seconds", "Seconds spent in swap I/O"),
    ("swap_stall_seconds", f"{HIFC}swap_stall_seconds", "Seconds steps waited for swap I/O"),
    ("swap_out_stall_seconds", f"{HIFC}swap_out_stall_seconds",
     "Of the swap stall, seconds waited while the oldest swap job was a swap-out"),
    ("swap_out_blocks_freed_staged", f"{HIFC}swap_out_blocks_freed_staged",
     "GPU KV blocks that swap-outs freed once staged in host memory, before their write ended"),
    ("prefix_store_queries", f"{HIFC}prefix_store_queries",
     "Tokens of the admitted sequences after their GPU prefix hit, looked up in the flash "
     "prefix store"),
    ("prefix_store_hits", f"{HIFC}prefix_store_hits",
     "Of the prefix store queries, tokens found in the flash prefix store"),
    ("prefix_store_recomputed", f"{HIFC}prefix_store_recomputed",
     "Of the prefix store hits, tokens the cost rule chose to recompute rather than read"),
    ("prefix_store_bytes_read", f"{HIFC}prefix_store_bytes_read",
     "Bytes of KV read from the flash prefix store"),
    ("prefix_store_bytes_written", f"{HIFC}prefix_store_bytes_written",
     "Bytes of KV written to the flash prefix store"),
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
        family = kind(f"{HIFC}{name}", doc, labels=[label])
        for row in rows:
            if row.get(key) is not None:
                family.add_metric([str(row[label_key])], row[key])
        yield family


class _EngineStatsCollector(Collector):
    def __init__(self, read_stats: Callable[[], dict], model_name: str):
        self._read_stats = read_stats
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats = self._read_stats()
        total, free = stats.get("gpu_blocks_total", 0), stats.get("gpu_blocks_free", 0)
        gauges = [(name, doc, stats.get(key, 0)) for key, name, doc in _GAUGES]
        gauges.append((f"{VLLM}kv_cache_usage_perc",
                       "Fraction of device KV blocks in use (0..1; 1 = full)",
                       (total - free) / total if total else 0.0))
        tier_total = stats.get("tier_blocks_total", 0)
        gauges.append((f"{HIFC}tier_usage_ratio", "Fraction of swap tier blocks in use (0..1)",
                       stats.get("tier_blocks_used", 0) / tier_total if tier_total else 0.0))
        for name, doc, value in gauges:
            yield self._family(GaugeMetricFamily, name, doc, value)
        for key, name, doc in _COUNTERS:
            if key in stats:
                yield self._family(CounterMetricFamily, name, doc, stats[key])
        if len(stats.get("replicas", ())) > 1:  # one replica: the engine in its own process
            yield from _labelled(stats["replicas"], "replica", "replica", _REPLICA_METRICS)
            yield from _labelled(stats["flash_devices"], "device", "device", _DEVICE_METRICS)

    def _family(self, kind, name: str, doc: str, value: float) -> Metric:
        """A vLLM metric carries the model_name label; hifc's have none."""
        if not name.startswith(VLLM):
            return kind(name, doc, value=value)
        family = kind(name, doc, labels=["model_name"])
        family.add_metric([self._model_name], value)
        return family


class ServerMetrics:
    """The registry of one server; also the engine thread's RequestObserver."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry(auto_describe=True)
        self._model_name = model_name
        self._ttft = self._histogram("time_to_first_token_seconds",
                                     "Time from arrival to the first generated token",
                                     _LATENCY_BUCKETS)
        self._tpot = self._histogram("time_per_output_token_seconds",
                                     "Mean time per output token after the first, per request",
                                     _TPOT_BUCKETS)
        self._e2e = self._histogram("e2e_request_latency_seconds",
                                    "Time from arrival to the last token", _E2E_BUCKETS)
        self._queue = self._histogram("request_queue_time_seconds",
                                      "Time from arrival to the first step that ran the request",
                                      _E2E_BUCKETS)
        self._prompt_tokens = self._histogram("request_prompt_tokens",
                                              "Prompt tokens per request", _TOKEN_BUCKETS)
        self._generation_tokens = self._histogram(
            "request_generation_tokens", "Tokens generated per request (all n completions)",
            _TOKEN_BUCKETS)
        self._n = self._histogram("request_params_n", "The n parameter of requests",
                                  _N_BUCKETS)
        self._finished = Counter(f"{VLLM}request_success",
                                 "Requests that finished, by finish reason",
                                 ["model_name", "finished_reason"], registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets) -> Histogram:
        return Histogram(f"{VLLM}{name}", doc, ["model_name"], buckets=buckets,
                         registry=self.registry).labels(model_name=self._model_name)

    def export_engine_stats(self, read_stats: Callable[[], dict]) -> None:
        """Export the engine's counters and gauges, read by ``read_stats`` at each scrape."""
        self.registry.register(_EngineStatsCollector(read_stats, self._model_name))

    def on_first_token(self, output: RequestOutput) -> None:
        m = output.metrics
        self._ttft.observe(m.first_token_time - m.arrival_time)

    def on_finished(self, request: FinishedRequest) -> None:
        m = request.metrics
        if m.finished_time is not None:
            self._e2e.observe(m.finished_time - m.arrival_time)
        if m.time_in_queue is not None:
            self._queue.observe(m.time_in_queue)
        longest = max(request.generated)
        if longest > 1 and m.first_token_time is not None and m.last_token_time is not None:
            self._tpot.observe((m.last_token_time - m.first_token_time) / (longest - 1))
        self._prompt_tokens.observe(request.prompt_tokens)
        self._generation_tokens.observe(sum(request.generated))
        self._n.observe(len(request.generated))
        self._finished.labels(model_name=self._model_name,
                              finished_reason=request.finish_reason or "unknown").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
