"""Who can use a server and what it tells them: a key read from a file (not on the command line),
no service beyond loopback without a key, and no filesystem path in any answer."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.server.helpers import REPO_ROOT, free_port, metric_values, start_server, stop_server

KEY = "key-from-a-file"


@pytest.fixture(scope="module")
def path_server(tiny_model_dir, tmp_path_factory):
    """A server given the model by its path, no --served-model-name, the key in a file."""
    workdir = tmp_path_factory.mktemp("access")
    key_file = workdir / "api-key"
    key_file.write_text(KEY + "\n")
    proc, base_url = start_server(tiny_model_dir, workdir / "server.log", [
        "--api-key-file", str(key_file), "--block-size", "16", "--max-model-len", "128",
        "--num-gpu-blocks", "16"])
    try:
        yield proc, base_url
    finally:
        stop_server(proc)


def test_served_by_path_answers_with_the_directory_name_only(path_server, tiny_model_dir):
    proc, base_url = path_server
    name = tiny_model_dir.name
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=30) as http:
        models = http.get("/v1/models")
        assert [m["id"] for m in models.json()["data"]] == [name]
        answers = [models, http.get(f"/v1/models/{name}"), http.get("/v1/models/other"),
                   http.post("/v1/completions", json={"model": "other", "prompt": "hi"}),
                   http.get("/no/such/route"), http.get("/metrics")]
        assert [r.status_code for r in answers] == [200, 200, 404, 404, 404, 200]
        for answer in answers:
            assert str(tiny_model_dir.parent) not in answer.text
        assert any(f'model_name="{name}"' in line for line in answers[-1].text.splitlines())
        ok = http.post("/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["model"] == name
    assert metric_values(answers[-1].text)["hifc_num_requests_running"] == 0


def test_key_from_a_file_is_required_and_not_on_the_command_line(path_server):
    proc, base_url = path_server
    assert httpx.get(f"{base_url}/v1/models").status_code == 401
    assert httpx.get(f"{base_url}/v1/models",
                     headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert KEY not in " ".join(map(str, proc.args))


def test_serving_beyond_loopback_without_a_key_is_refused():
    host = "0.0.0.0"  # every address: test_server_app.py
    env = {k: v for k, v in os.environ.items() if k != "HIFC_API_KEY"}
    # a subprocess with a timeout: a server that is not refused would otherwise run on
    done = subprocess.run([sys.executable, "-m", "hifc.entrypoints.cli", "serve",
                           "random:tiny-llama", "--device", "cpu", "--host", host, "--port",
                           str(free_port())], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"--host {host}: refusing to serve beyond loopback without an API key" in done.stderr
    assert "--allow-unauthenticated" in done.stderr
