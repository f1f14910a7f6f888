"""Probes of the device for ``hifc bench kernels``: its copy and matrix rates, the GPU time of a
decode step's CUDA graph, and where a step's time goes (the graph's kernels, the host functions of
``LLMEngine.step``, and the device timeline of whole steps run back to back)."""
from __future__ import annotations

import cProfile
import gc
import json
import os
import pstats
import tempfile
import time


def sync(device) -> None:
    import torch
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def free_device_memory(device=None) -> None:
    """Collect garbage and return cached CUDA memory (device None: if CUDA is there at all)."""
    import torch
    gc.collect()
    on_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    if on_cuda:
        torch.cuda.empty_cache()


def copy_gbps(device, nbytes: int | None = None, repeats: int = 10) -> float:
    """Device-to-device copy rate in GB/s, (read + write) bytes / s; 1 GiB on CUDA, 64 MiB
    elsewhere unless nbytes says."""
    import torch
    device = torch.device(device)
    nbytes = nbytes or (1 << 30 if device.type == "cuda" else 64 << 20)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync(device)
    rate = 2 * repeats * nbytes / (time.perf_counter() - t0) / 1e9
    del src, dst
    free_device_memory(device)
    return rate


def matmul_rates(device, dtype) -> tuple[float, float]:
    """TFLOP/s (2 n^3 per product) of n x n matmuls in dtype (n = 8192 on CUDA, 512
    elsewhere): the burst rate, over 10 products, then on the same operands the sustained one,
    timed over 200 products once products have run back to back for 1.5 s (CUDA; 10 after 0.2
    s elsewhere). A GPU holds its top clock for a burst only: under a power limit (an H200's
    700 W) a second of matmuls lowers it, and its clock then moves from one 30 ms window to the
    next (the 200 products are about 0.3 s of bf16 8192-cubed on an H200)."""
    import torch
    cuda = torch.device(device).type == "cuda"
    burst, sustained = _matmul_rates(device, dtype,
                                     [(10, 0.0), (200, 1.5) if cuda else (10, 0.2)])
    return burst, sustained


def _matmul_rates(device, dtype, phases: list[tuple[int, float]]) -> list[float]:
    """After three warm-up products, each phase's rate, one phase after the other on one set
    of operands: (repeats, after_s) times ``repeats`` products once products have run back to
    back for ``after_s`` seconds."""
    import torch
    device = torch.device(device)
    n = 8192 if device.type == "cuda" else 512
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=out)
    sync(device)
    rates = []
    for repeats, after_s in phases:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < after_s:
            for _ in range(repeats):
                torch.matmul(a, b, out=out)
            sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            torch.matmul(a, b, out=out)
        sync(device)
        rates.append(2 * n ** 3 * repeats / (time.perf_counter() - t0) / 1e12)
    del a, b, out
    free_device_memory(device)
    return rates


def graph_capture_info(engine) -> dict:
    """The decode CUDA graphs the engine captured: batch sizes, context caps (of the graphs
    with a prompt chunk, and each batch size's decode graphs'), how many (and how many of
    decodes beside a prompt chunk), capture time and memory."""
    graphs = engine.runner.decode_graphs
    return {"captured_sizes": graphs.captured_sizes if graphs else [],
            "context_caps": graphs.context_caps if graphs and graphs.graphs else [],
            "decode_context_caps": graphs.decode_caps if graphs and graphs.graphs else {},
            "decode_graphs": len(graphs.graphs) if graphs else 0,
            "chunk_graphs": len(graphs.chunk_graphs) if graphs else 0,
            "capture_seconds": graphs.capture_seconds if graphs else 0.0,
            "capture_mib": graphs.capture_bytes / 2**20 if graphs else 0.0}


def replay_times(engine, batch: int, profile: bool, repeats: int = 20) -> dict:
    """GPU time of the decode graph the last step replayed (``forward_ms``: model and logits,
    no host work), re-replayed ``repeats`` times between CUDA events; it rewrites the same K/V
    from the same inputs. With ``profile``, the kernels of one replay, longest first
    (``kernels``: name, calls, ms). Empty without captured graphs, and with tensor parallelism
    (a graph's collectives wait for the other ranks, which replay only what rank 0 sends)."""
    graphs = engine.runner.decode_graphs
    if engine.tp is not None:
        return {}
    key = graphs.last_replayed if graphs is not None else None
    if key is None or key[0] != graphs.batch_size_for_rows(batch):
        return {}
    import torch
    graph = graphs.graphs[key]
    size = key[0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(engine.device):
        sync(engine.device)
        start.record()
        for _ in range(repeats):
            graph.replay()
        end.record()
        end.synchronize()
        result = {"padded_batch": size, "context_cap": key[1],
                  "forward_ms": start.elapsed_time(end) / repeats}
        if profile:
            result["kernels"] = profile_replay(graph)
    return result


def profile_replay(graph, top: int = 15) -> list[dict]:
    return profile_kernels(graph.replay, top)


def profile_kernels(fn, top: int = 15) -> list[dict]:
    """The CUDA kernels ``fn()`` runs, by total time, longest first (name, calls, ms)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            calls, us = kernels.get(e.name, (0, 0.0))
            kernels[e.name] = (calls + 1, us + e.device_time)
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"name": name, "calls": calls, "ms": us / 1000} for name, (calls, us) in ranked]


# Chrome-trace categories of device work (torch profiler's export)
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
STEP_END = "Memcpy DtoH"  # a decode step's last device work: its sampled ids to the host


def step_timeline(fn, steps: int) -> dict:
    """The device timeline (``timeline``) of ``steps`` decode steps run back to back, from
    torch's profiler with CUDA activity only (host tracing would slow the host and widen the
    gaps it leaves). ``fn()`` runs the steps, one more than ``steps``: the window starts where
    the first one profiled ends, past the profiler's start."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return timeline(events, steps)


def timeline(events: list[dict], steps: int, top: int = 12) -> dict:
    """Per step, from Chrome-trace events (``ph`` "X", ``ts`` and ``dur`` in us) of decode
    steps: between the end of the first step's copy of its sampled ids to the host and the end
    of the copy ``steps`` steps later (the whole trace where it holds fewer such copies), the
    span, the time some event ran (``busy_ms``: events that overlap, as launches under
    programmatic dependent launch do, count once) and the rest (``idle_ms``); the ``top`` events
    by time (name, calls, ms per step) and the ``top`` idle stretches by the event before and
    after them (us per step, how often; the event before is None at the window's start)."""
    work = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES),
                  key=lambda e: e["ts"])
    ends = [e["ts"] + e["dur"] for e in work if e["name"].startswith(STEP_END)]
    if len(ends) > steps:
        start, stop = ends[0], ends[steps]
        work = [e for e in work if start <= e["ts"] < stop]
    elif work:
        start, stop = work[0]["ts"], max(e["ts"] + e["dur"] for e in work)
    if not work:
        return {}
    covered, busy, last = start, 0.0, None
    by_name: dict[str, list] = {}
    idle: dict[tuple[str | None, str], list] = {}
    for e in work:
        begin, end = e["ts"], min(e["ts"] + e["dur"], stop)
        if begin > covered:
            gap = idle.setdefault((last, e["name"]), [0, 0.0])
            gap[0] += 1
            gap[1] += begin - covered
        if end > covered:
            busy += end - max(begin, covered)
            covered, last = end, e["name"]
        entry = by_name.setdefault(e["name"], [0, 0.0])
        entry[0] += 1
        entry[1] += e["dur"]
    span = stop - start
    kernels = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    gaps = sorted(idle.items(), key=lambda kv: -kv[1][1])[:top]
    return {"steps": steps, "span_ms": span / steps / 1000, "busy_ms": busy / steps / 1000,
            "idle_ms": (span - busy) / steps / 1000,
            "kernels": [{"name": name, "calls": calls / steps, "ms": us / steps / 1000}
                        for name, (calls, us) in kernels],
            "idle": [{"after": after, "before": before, "count": count / steps,
                      "us": us / steps} for (after, before), (count, us) in gaps]}


def host_functions(prof: cProfile.Profile, steps: int, top: int = 12) -> list[dict]:
    """The functions the timed steps spent most host time in (own time, ms per step)."""
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, ...)
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"function": f"{name} ({file.rsplit('/', 1)[-1]}:{line})", "calls": nc,
             "ms_per_step": 1000 * tottime / steps}
            for (file, line, name), (_, nc, tottime, _, _) in ranked]
