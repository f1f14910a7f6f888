"""The Triton kernels' CPU cases (attention, KV write, fused norm/SiLU/rotary, sampling
penalties, padded decode through Triton) in a child pytest with TRITON_INTERPRET=1, one child per
test file, so that the default suite runs them. The children start together; each one's output
goes to the terminal when it ends.

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
import subprocess
import sys
from pathlib import Path

import pytest
import torch

FILES = ["tests/layers/test_triton_attention.py", "tests/layers/test_triton_fused.py",
         "tests/layers/test_triton_penalties.py",
         "tests/runtime/test_decode_graphs_triton.py"]
SELECTION = ("not split_kv_on_mixed_batch and not (mixed_batch_8b_shape and not 8b_shape[16-) "
             "and not (head_shapes and -256-) "
             "and not (fresh_prompts_attend_densely and not query_lens1) "
             "and not (after_cached_context and 64-)")


@pytest.fixture(scope="module")
def children(request, tmp_path_factory):
    """One child pytest per selected file, all started at once (on a 2-core machine the short
    files run beside the attention file instead of after it), each writing to its own log."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1")
    logs = tmp_path_factory.mktemp("interpreter")
    selected = [item.callspec.params["path"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_triton_kernels_in_the_interpreter"]
    started = {}
    for i, path in enumerate(selected):
        log = open(logs / f"{i}.log", "w+")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                   SELECTION, path]
        started[path] = (subprocess.Popen(command, cwd=root, env=env, stdout=log,
                                          stderr=subprocess.STDOUT), log)
    yield started
    for child, log in started.values():
        child.kill()
        child.wait()
        log.close()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available(),
                    reason="the cases run directly here")
@pytest.mark.parametrize("path", FILES)
def test_triton_kernels_in_the_interpreter(path, children, capsys):
    child, log = children[path]
    returncode = child.wait(timeout=900)
    log.seek(0)
    with capsys.disabled():  # the child's output goes to the terminal
        print(f"\n[Triton interpreter] {path}\n{log.read()}", flush=True)
    assert returncode == 0, f"the interpreter run of {path} failed: see its output above"
