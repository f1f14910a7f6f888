"""The ``hifc`` command line: generate, with and without the flash tier, and its errors."""
import pytest

from hifc.entrypoints.cli import main
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


def test_version_flag(capsys):
    from hifc import __version__
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"hifc {__version__}"


@pytest.mark.parametrize("alias, name", [("half", "float16"), ("float", "float32"),
                                         ("bfloat16", "bfloat16")])
def test_dtype_aliases(alias, name):
    from hifc.config import EngineConfig
    assert EngineConfig.from_options("random:tiny-llama", dtype=alias).dtype == name


def test_serve_chat_template_from_file_or_text(tmp_path):
    from hifc.entrypoints.server.cli import read_chat_template
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = tmp_path / "t.jinja"
    path.write_text(template)
    assert read_chat_template(str(path)) == template == read_chat_template(template)
    assert read_chat_template(None) is None
    with pytest.raises(ValueError, match="neither a file nor a Jinja template"):
        read_chat_template(str(tmp_path / "missing.jinja"))
