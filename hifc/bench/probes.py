"""Probes of the device for ``hifc bench kernels``: its copy and matrix rates, the GPU time of a
decode step's CUDA graph, and where a step's time goes (the graph's kernels, the host functions of
``LLMEngine.step``)."""
from __future__ import annotations

import cProfile
import gc
import pstats
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


def matmul_tflops(device, dtype, n: int | None = None, repeats: int = 10) -> float:
    """TFLOP/s (2 n^3 per product) of n x n matmuls in dtype; n = 8192 on CUDA, 512 elsewhere."""
    import torch
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 512)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=out)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b, out=out)
    sync(device)
    rate = 2 * n ** 3 * repeats / (time.perf_counter() - t0) / 1e12
    del a, b, out
    free_device_memory(device)
    return rate


def graph_capture_info(engine) -> dict:
    """The decode CUDA graphs the engine captured: batch sizes, context caps, how many (and
    how many of decodes beside a prompt chunk), capture time and memory."""
    graphs = engine.runner.decode_graphs
    return {"captured_sizes": graphs.captured_sizes if graphs else [],
            "context_caps": graphs.context_caps if graphs and graphs.graphs else [],
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


def host_functions(prof: cProfile.Profile, steps: int, top: int = 12) -> list[dict]:
    """The functions the timed steps spent most host time in (own time, ms per step)."""
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, ...)
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"function": f"{name} ({file.rsplit('/', 1)[-1]}:{line})", "calls": nc,
             "ms_per_step": 1000 * tottime / steps}
            for (file, line, name), (_, nc, tottime, _, _) in ranked]
