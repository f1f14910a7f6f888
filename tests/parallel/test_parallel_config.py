"""Parallel options: validation with clear errors, per-replica flash files and devices, the
command-line flags, and the balancer's choices. No process is started here."""
from __future__ import annotations

import argparse

import pytest

from hifc.config import EngineConfig, add_engine_args, engine_config_from_args
from hifc.engine.llm_engine import LLMEngine
from hifc.parallel.balance import LeastOutstandingTokens
from hifc.parallel.config import replica_config, replica_flash_paths
from hifc.parallel.devices import replica_devices, shared_flash_devices

FLASH = dict(kv_offload="flash", num_tier_blocks=8)


@pytest.mark.parametrize("options,message", [
    (dict(data_parallel_size=0), "data_parallel_size must be an integer in"),
    (dict(data_parallel_size="2"), "data_parallel_size must be an integer in"),
    (dict(data_parallel_size=True), "data_parallel_size must be an integer in"),
    (dict(tensor_parallel_size=2, data_parallel_size=2), "not available; choose one of them"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be an integer in"),
    (dict(flash_arbiter="yes"), "flash_arbiter must be True or False"),
    (dict(flash_arbiter_window_mib=0), "flash_arbiter_window_mib must be an integer in"),
    (dict(data_parallel_size=2, device="cuda:1"), "runs replica i on cuda:i"),
    (dict(data_parallel_size=2, flash_path="/tmp/one.kv", **FLASH),
     "needs one flash file per replica"),
    (dict(data_parallel_size=3, flash_path="/tmp/a.kv,/tmp/b.kv", **FLASH),
     "needs one flash file per replica"),
    (dict(data_parallel_size=2, flash_path="/tmp/a.kv,", **FLASH),
     "needs one flash file per replica"),
    (dict(data_parallel_size=2, flash_path="/tmp/a.kv,/tmp/../tmp/a.kv", **FLASH),
     "names one file for several replicas"),
])
def test_bad_parallel_options_get_clear_errors(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_options("random:tiny-llama", **options)


def test_each_replica_gets_its_own_flash_file_and_device():
    config = EngineConfig.from_options("random:tiny-llama", data_parallel_size=3,
                                       flash_path="/nvme/hifc-{replica}.kv", **FLASH)
    replicas = [replica_config(config, i, f"cuda:{i}") for i in range(3)]
    assert [r.tier.flash_path for r in replicas] == [f"/nvme/hifc-{i}.kv" for i in range(3)]
    assert [r.device for r in replicas] == ["cuda:0", "cuda:1", "cuda:2"]
    assert {r.parallel.data_parallel_size for r in replicas} == {1}
    assert replica_flash_paths("/a/x.kv, /b/y.kv", 2) == ["/a/x.kv", "/b/y.kv"]
    # one replica: the path as given, a template names replica 0's file
    assert replica_flash_paths("/a/x,y.kv", 1) == ["/a/x,y.kv"]
    assert replica_flash_paths("/a/x-{replica}.kv", 1) == ["/a/x-0.kv"]


def test_replicas_run_on_the_cpu_or_one_gpu_each(monkeypatch):
    config = EngineConfig.from_options("random:tiny-llama", data_parallel_size=2, device="cpu")
    assert replica_devices(config) == ["cpu", "cpu"]
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    config = EngineConfig.from_options("random:tiny-llama", data_parallel_size=2, device="cuda")
    assert replica_devices(config) == ["cuda:0", "cuda:1"]
    # one replica (an engine in a process of its own) runs where the engine was asked to
    for device, expected in (("cuda:1", "cuda:1"), ("cuda", "cuda:0"), ("cpu", "cpu")):
        config = EngineConfig.from_options("random:tiny-llama", device=device)
        assert replica_devices(config) == [expected]
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    config = EngineConfig.from_options("random:tiny-llama", device="auto")
    assert replica_devices(config) == ["cpu"]


def test_files_in_one_directory_share_a_device(tmp_path):
    (tmp_path / "a").mkdir()
    paths = [str(tmp_path / "a" / "x.kv"), str(tmp_path / "y.kv"), "/proc/self/z.kv"]
    (label, replicas), = shared_flash_devices(paths)  # /proc is another file system
    assert replicas == [0, 1] and ":" in label
    with pytest.raises(ValueError, match="directory of flash file"):
        shared_flash_devices([str(tmp_path / "missing" / "x.kv"), str(tmp_path / "y.kv")])


def test_one_engine_refuses_several_replicas():
    config = EngineConfig.from_options("random:tiny-llama", data_parallel_size=2, device="cpu")
    with pytest.raises(ValueError, match="an LLMEngine is one replica"):
        LLMEngine(config)


def test_parallel_flags_and_their_short_forms():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(
        ["-dp", "2", "--no-flash-arbiter", "--flash-arbiter-window-mib", "64"]))
    assert config.parallel.data_parallel_size == 2 and not config.parallel.flash_arbiter
    assert config.parallel.flash_arbiter_window_mib == 64
    long_form = engine_config_from_args(parser.parse_args(["--data-parallel-size", "2"]))
    assert long_form.parallel.data_parallel_size == 2
    assert engine_config_from_args(parser.parse_args(["-tp", "1"])).parallel.tensor_parallel_size \
        == 1


def test_balancer_sends_each_request_to_the_replica_with_fewest_outstanding_tokens():
    balancer = LeastOutstandingTokens(2)
    assert balancer.place("a", 100, 50, 4096) == 0
    assert balancer.place("b", 10, 10, 4096) == 1
    assert balancer.place("c", 10, 10, 4096) == 1  # 20 < 150
    assert balancer.outstanding == [150, 40]
    balancer.generated("a", 30)
    balancer.finished("b")
    assert balancer.outstanding == [120, 20]
    assert balancer.place("d", 8000, 1000, 4096) == 1  # counted up to max_model_len
    assert balancer.outstanding == [120, 4116]
    assert balancer.replica_of("d") == 1 and balancer.replica_of("b") is None
    with pytest.raises(ValueError, match="already placed"):
        balancer.place("a", 1, 1, 4096)
