"""Helpers of the server tests: start/stop a real ``hifc serve`` process, read its metrics, or
serve an engine in-process through a TestClient."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from hifc.bench.serve import wait_healthy
from hifc.ports import free_port

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

    from hifc.engine.llm_engine import LLMEngine

API_KEY = "test-key"
MODEL_NAME = "tiny-chat"
MAX_MODEL_LEN = 256
NUM_GPU_BLOCKS = 40  # block 16: 640 tokens, so 50 concurrent streams preempt and swap
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Server:
    base_url: str  # http://127.0.0.1:PORT
    model: str
    api_key: str
    model_dir: Path
    log_path: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=30, **kwargs)


def start_server(model_dir: Path, log_path: Path, extra_args: list[str],
                 timeout_s: float = 90.0, new_session: bool = False
                 ) -> tuple[subprocess.Popen, str]:
    """``hifc serve`` on the CPU and a free port, once healthy (``new_session``: in a process
    group of its own, as a terminal's foreground job is)."""
    port = free_port()
    cmd = [sys.executable, "-m", "hifc.entrypoints.cli", "serve", "--model", str(model_dir),
           "--device", "cpu", "--host", "127.0.0.1", "--port", str(port), *extra_args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env,
                            start_new_session=new_session)
    log.close()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, lambda: proc.poll() is not None, timeout_s)
    except RuntimeError as exc:
        stop_server(proc)
        raise RuntimeError(f"{exc} (exit status {proc.returncode}):\n{log_path.read_text()}"
                           ) from None
    return proc, base_url


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name (with labels, if any): value}, via the official parser."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def wait_until_idle(server: Server, timeout_s: float = 30.0) -> dict[str, float]:
    """Metrics once no request runs, waits or is swapped and every KV block is free."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = metric_values(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
        labels = f"{{model_name={server.model}}}"
        idle = (values[f"vllm:num_requests_running{labels}"] == 0
                and values[f"vllm:num_requests_waiting{labels}"] == 0
                and values["hifc_num_requests_swapped"] == 0
                and values["hifc_gpu_kv_blocks_free"] == values["hifc_gpu_kv_blocks_total"]
                and values["hifc_tier_blocks_used"] == 0)
        if idle or time.monotonic() > deadline:
            return values
        time.sleep(0.1)


def app_client(engine: LLMEngine, name: str = "m", **settings) -> TestClient:
    """A fastapi TestClient of the app serving ``engine`` (an LLMEngine) as model ``name``, with
    its metrics wired up as ``hifc serve`` does (``settings``: more ServerSettings fields); the
    AsyncEngine is ``client.app.state.async_engine``. Enter it (``with``) to start the engine
    thread."""
    from fastapi.testclient import TestClient

    from hifc.entrypoints.server.app import ServerSettings, build_app
    from hifc.entrypoints.server.async_engine import AsyncEngine
    from hifc.entrypoints.server.metrics import ServerMetrics

    metrics = ServerMetrics(name)
    async_engine = AsyncEngine(engine, observer=metrics)
    metrics.export_engine_stats(async_engine.stats)
    return TestClient(build_app(async_engine, metrics, ServerSettings((name,), **settings)))
