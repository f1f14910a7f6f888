"""cpu_threads: torch's CPU threads on a small or busy machine."""
import os
import subprocess
import sys
import textwrap

import torch

from hifc import LLM
from hifc.engine.threads import usable_cores

_DEFAULT_THREADS = textwrap.dedent("""
    from hifc import LLM
    llm = LLM("random:tiny-llama", device="cpu", block_size=16, num_gpu_blocks=8)
    print(llm.engine.cpu_threads)
""")


def _threads_in_child(env: dict) -> int:
    out = subprocess.run([sys.executable, "-c", _DEFAULT_THREADS], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_default_is_one_thread_fewer_than_usable_cores():
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    assert _threads_in_child(env) == max(1, usable_cores() - 1)


def test_omp_num_threads_is_left_alone_and_cpu_threads_sets_torch_threads():
    assert os.environ.get("OMP_NUM_THREADS")  # tests/conftest.py sets it
    before = torch.get_num_threads()
    try:
        llm = LLM("random:tiny-llama", device="cpu", block_size=16, num_gpu_blocks=8)
        assert llm.engine.cpu_threads == before  # the operator's choice stands
        llm = LLM("random:tiny-llama", device="cpu", block_size=16, num_gpu_blocks=8,
                  cpu_threads=before + 1)
        assert llm.engine.cpu_threads == before + 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_usable_cores_honour_a_cgroup_cpu_quota(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    affinity = len(os.sched_getaffinity(0))
    cpu_max.write_text("max 100000\n")
    assert usable_cores(str(cpu_max)) == affinity
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs
    assert usable_cores(str(cpu_max)) == 1
    assert usable_cores(str(tmp_path / "none")) == affinity
