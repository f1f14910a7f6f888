"""The Triton kernels' CPU cases (attention, KV write, fused norm/SiLU/rotary, TMA prompt
attention, sampling penalties, greedy argmax, host transfers, padded decode through Triton) in
a child pytest with TRITON_INTERPRET=1, one child per test file, so that the default suite runs
them. The children start together as soon as the session's tests are collected
(tests/conftest.py), beside the rest of the suite; each one's output goes to the terminal when it
ends.

The variable must be set before triton is imported, and it would make every Triton test of this
process interpret, so the cases run in their own process. Cases that need a real GPU skip there.

In the interpreter an attention case takes seconds to a minute, so here each kernel path runs
once per dtype rather than once per shape: the mixed-batch and head-shape sweeps at block size 16
only, split-KV through the decode-only cases (the mixed-batch split-KV cases take ~50 s each), and
dense prefill against the paged kernel on one set of prompts (~50 s each), and chunks after
cached context at one block size (~13 s each).
Everything runs with ``TRITON_INTERPRET=1 python -m pytest tests/layers/test_triton_*.py
tests/runtime/test_decode_graphs_triton.py``.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

FILES = ["tests/layers/test_triton_attention.py", "tests/layers/test_triton_fused.py",
         "tests/layers/test_triton_gemv.py", "tests/layers/test_triton_prompt_attention.py",
         "tests/layers/test_triton_penalties.py", "tests/layers/test_triton_argmax.py",
         "tests/layers/test_triton_bitmask.py", "tests/layers/test_triton_host_io.py",
         "tests/runtime/test_decode_graphs_triton.py"]
SELECTION = ("not split_kv_on_mixed_batch and not (mixed_batch_8b_shape and not 8b_shape[16-) "
             "and not (head_shapes and -256-) "
             "and not (fresh_prompts_attend_densely and not query_lens1) "
             "and not (after_cached_context and 64-)")
RUNS_HERE = (importlib.util.find_spec("triton") is not None
             and os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available())


class Children:
    """One child pytest per file, all started at once, each writing to its own log."""

    def __init__(self, paths: list[str]):
        root = Path(__file__).resolve().parents[1]
        env = dict(os.environ, TRITON_INTERPRET="1")
        self.logs = Path(tempfile.mkdtemp(prefix="hifc-interpreter-"))
        self.started = {}
        for i, path in enumerate(paths):
            log = open(self.logs / f"{i}.log", "w+")
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                       SELECTION, path]
            self.started[path] = (subprocess.Popen(command, cwd=root, env=env, stdout=log,
                                                   stderr=subprocess.STDOUT), log)

    def stop(self) -> None:
        for child, log in self.started.values():
            child.kill()
            child.wait()
            log.close()
        shutil.rmtree(self.logs, ignore_errors=True)


def selected_paths(items) -> list[str]:
    """The files whose interpreter case is among the session's selected tests."""
    return [item.callspec.params["path"] for item in items
            if getattr(item, "originalname", None) == "test_triton_kernels_in_the_interpreter"]


@pytest.fixture(scope="module")
def children(request):
    """The children tests/conftest.py started once the session's tests were collected (so that
    they run beside the rest of the suite on a second core), or started here."""
    started = getattr(request.config, "interpreter_children", None)
    if started is None:
        started = request.config.interpreter_children = Children(
            selected_paths(request.session.items))
    yield started.started
    started.stop()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.skipif(not RUNS_HERE, reason="the cases run directly here")
@pytest.mark.parametrize("path", FILES)
def test_triton_kernels_in_the_interpreter(path, children, capsys):
    child, log = children[path]
    returncode = child.wait(timeout=900)
    log.seek(0)
    with capsys.disabled():  # the child's output goes to the terminal
        print(f"\n[Triton interpreter] {path}\n{log.read()}", flush=True)
    assert returncode == 0, f"the interpreter run of {path} failed: see its output above"
