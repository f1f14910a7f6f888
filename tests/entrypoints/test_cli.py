"""The ``hifc`` command line: generate, with and without the flash tier, and its errors."""
import argparse
import errno
import os
import shutil

import pytest

from hifc.entrypoints.cli import main
from hifc.entrypoints.user_errors import describe
from tests.fixtures import make_tiny_hf_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_hf_model(tmp_path_factory.mktemp("cli"), "llama"))


def test_generate_prints_one_completion_per_prompt(model_dir, capsys):
    rc = main(["generate", "--model", model_dir, "--device", "cpu", "--prompt", "hello there",
               "--prompt", "flash", "--max-tokens", "4", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("--- prompt:") == 2 and "'hello there'" in out


def test_generate_with_flash_swapping_reports_swaps(model_dir, tmp_path, capsys):
    rc = main(["generate", "--model", model_dir, "--device", "cpu", "--chat", "--no-progress",
               "--prompt", "a b c d", "--prompt", "e f g h", "--prompt", "i j k l",
               "--max-tokens", "40", "--block-size", "16", "--num-gpu-blocks", "8",
               "--kv-offload", "flash", "--flash-path", str(tmp_path / "kv"),
               "--flash-size-gib", "0.01"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "[hifc] preemptions" in err
    assert (tmp_path / "kv").exists()


@pytest.mark.parametrize("args, message", [
    (["--max-tokens", "0"], "max_tokens must be at least 1"),
    (["--temperature", "-1"], "temperature must be non-negative"),
    (["--kv-offload", "flash"], "flash_path"),
])
def test_generate_bad_input_exits_2_with_message(model_dir, capsys, args, message):
    rc = main(["generate", "--model", model_dir, "--device", "cpu", "--prompt", "x", *args])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_unknown_model_exits_2(capsys):
    rc = main(["generate", "--model", "no-such-model", "--device", "cpu", "--prompt", "x"])
    assert rc == 2
    assert "no-such-model" in capsys.readouterr().err


def _generate(capsys, model_dir, *args) -> tuple[int, str]:
    try:
        rc = main(["generate", "--model", str(model_dir), "--device", "cpu", "--no-progress",
                   "--max-tokens", "2", *args])
    except SystemExit as exc:  # refused by argparse: usage, then one error line
        rc = exc.code
    return rc, capsys.readouterr().err


def _flash(path) -> list[str]:
    return ["--block-size", "16", "--kv-offload", "flash", "--flash-path", str(path),
            "--flash-size-gib", "0.01"]


def _one_line_error(rc: int, err: str, *parts: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("hifc generate: error: "), err
    for part in parts:
        assert part in last, last


@pytest.fixture(scope="module")
def corrupt_model_dir(model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("corrupt") / "tiny"
    shutil.copytree(model_dir, path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    return path


@pytest.mark.parametrize("make_args, parts", [
    (lambda d: _flash(d / "kv")[:-1] + ["inf"], ["--flash-size-gib", "must be a finite number"]),
    (lambda d: _flash(d / "kv")[:-1] + ["1e6"], ["does not fit on the file system", "GiB free"]),
    (lambda d: ["--kv-cache-gib", "inf"], ["--kv-cache-gib", "must be a finite number"]),
    (lambda d: ["--seed", str(2**80)], ["seed must be an integer in [0, 2**63)"]),
    (lambda d: ["--cpu-threads", "0"], ["cpu_threads must be a positive integer"]),
    (lambda d: ["--temperature", "nan"], ["temperature must be a finite number"]),
    (lambda d: _flash(d / "no" / "such" / "kv"),
     ["--flash-path", "no/such: No such file or directory"]),
    (lambda d: _flash(d), ["--flash-path", "Is a directory"]),
], ids=["size-inf", "size-1e6", "kv-cache-inf", "seed-2**80", "cpu-threads-0", "temperature-nan",
        "missing-directory", "directory-as-file"])
def test_user_errors_are_one_line_naming_the_option(model_dir, tmp_path, capsys, make_args,
                                                    parts):
    rc, err = _generate(capsys, model_dir, "--prompt", "x", *make_args(tmp_path))
    _one_line_error(rc, err, *parts)
    assert not (tmp_path / "kv").exists()


def test_corrupt_weights_are_one_line_naming_the_file(corrupt_model_dir, capsys):
    rc, err = _generate(capsys, corrupt_model_dir, "--prompt", "x")
    _one_line_error(rc, err, "cannot read weights", str(corrupt_model_dir / "model.safetensors"))


def test_debug_shows_the_traceback(model_dir, tmp_path, capsys):
    rc = main(["--debug", "generate", "--model", model_dir, "--device", "cpu", "--prompt", "x",
               *_flash(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" in err and "IsADirectoryError" in err


@pytest.mark.parametrize("prompt, message", [
    ("", "--prompt must not be empty"),  # found before the engine starts
    ("word " * 300, "maximum model length is 64"),  # found by the engine, after the file exists
])
def test_failed_run_leaves_no_cache_file_it_created(model_dir, tmp_path, capsys, prompt,
                                                    message):
    kv = tmp_path / "kv"
    rc, err = _generate(capsys, model_dir, "--prompt", prompt, "--max-model-len", "64",
                        *_flash(kv))
    _one_line_error(rc, err, message)
    assert not kv.exists()


def test_failed_run_keeps_the_cache_file_it_found(model_dir, tmp_path, capsys):
    kv = tmp_path / "kv"
    assert _generate(capsys, model_dir, "--prompt", "hello", *_flash(kv))[0] == 0
    rc, err = _generate(capsys, model_dir, "--prompt", "word " * 300, "--max-model-len", "64",
                        *_flash(kv))
    _one_line_error(rc, err, "maximum model length")
    assert kv.exists()


def test_error_names_the_option_whose_path_it_is(model_dir, capsys):
    holder = os.path.realpath(os.path.dirname(model_dir))  # holds the model directory too
    rc, err = _generate(capsys, model_dir, "--prompt", "x", *_flash(holder))
    _one_line_error(rc, err, f"--flash-path {holder}: Is a directory")


@pytest.mark.parametrize("error, expected", [
    (PermissionError(errno.EACCES, "Permission denied", "/data/kv"),
     "--flash-path /data/kv: Permission denied"),
    (PermissionError(errno.EACCES, "Permission denied", "/data"),  # its directory
     "--flash-path /data: Permission denied"),
    (OSError(errno.ENOSPC, "No space left on device"), "[Errno 28] No space left on device"),
    (OverflowError("cannot convert float infinity to integer"),
     "cannot convert float infinity to integer (number too large)"),
])
def test_os_errors_are_described_by_option_and_path(error, expected):
    args = argparse.Namespace(command="generate", flash_path="/data/kv", model="smollm2-135m")
    assert describe(error, args) == expected
