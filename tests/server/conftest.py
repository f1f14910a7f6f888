"""A real ``hifc serve`` process on a free loopback port, serving a tiny model (shared by the
server tests; stopped at the end of the session)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.helpers import (API_KEY, MAX_MODEL_LEN, MODEL_NAME, NUM_GPU_BLOCKS, Server,
                                  start_server, stop_server)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from tests.fixtures import make_tiny_hf_model
    return make_tiny_hf_model(tmp_path_factory.mktemp("server-model") / "tiny", "llama")


@pytest.fixture(scope="session")
def server(tiny_model_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("server-log") / "server.log"
    proc, base_url = start_server(tiny_model_dir, log_path, [
        "--served-model-name", MODEL_NAME, "--api-key", API_KEY, "--block-size", "16",
        "--max-model-len", str(MAX_MODEL_LEN), "--num-gpu-blocks", str(NUM_GPU_BLOCKS),
        "--kv-offload", "dram", "--swap-space", "0.01", "--max-num-seqs", "64",
        "--max-request-bytes", "65536"])
    try:
        yield Server(base_url, MODEL_NAME, API_KEY, tiny_model_dir, log_path)
    finally:
        stop_server(proc)
