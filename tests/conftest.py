"""Session-wide fixtures shared across test packages."""
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# what engines keep for later processes (the GEMM choices) goes to a directory of this run, not
# to the user's cache
os.environ.setdefault("HIFC_CACHE_ROOT", tempfile.mkdtemp(prefix="hifc-tests-"))
# torch's one thread per core fights other work on a small shared machine (see
# hifc.engine.threads): one fewer than the usable cores, here and in the processes tests start.
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) - 1)))

import pytest  # noqa: E402


def _patch_triton_interpreter() -> None:
    """Under TRITON_INTERPRET=1 (Triton kernels run on the CPU), fix two things in Triton 3.6's
    interpreter for every test package:

    - it turns one-element arrays into loop bounds with ``int(array)``, which numpy >= 2.?
      rejects: give its tensors an ``__index__`` that takes the element;
    - it converts float32 <-> bfloat16 by bit surgery that truncates (and garbles some values),
      where the GPU rounds to nearest even: convert through torch, which rounds as the GPU does.
    """
    try:
        import numpy as np
        import torch
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    if hasattr(interpreter, "_patch_lang_tensor"):
        original_patch = interpreter._patch_lang_tensor

        def _patch_lang_tensor(tensor, scope):
            original_patch(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

        interpreter._patch_lang_tensor = _patch_lang_tensor
    if hasattr(interpreter, "_convert_float"):
        original_convert = interpreter._convert_float

        def _convert_float(data, src_dtype, dst_dtype, rounding_mode):
            if src_dtype == tl.float32 and dst_dtype == tl.bfloat16:
                x = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
                return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            if src_dtype == tl.bfloat16 and dst_dtype == tl.float32:
                x = torch.from_numpy(np.ascontiguousarray(data).view(np.int16))
                return x.view(torch.bfloat16).float().numpy().view(np.uint32)
            return original_convert(data, src_dtype, dst_dtype, rounding_mode)

        interpreter._convert_float = _convert_float


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_triton_interpreter()


def pytest_collection_finish(session):
    """Start the Triton interpreter's child runs (tests/test_triton_interpreter.py) now, so
    that they run beside the rest of the suite instead of after it."""
    from tests.test_triton_interpreter import RUNS_HERE, Children, selected_paths
    paths = selected_paths(session.items)
    if paths and RUNS_HERE and not session.config.option.collectonly:
        session.config.interpreter_children = Children(paths)


def pytest_sessionfinish(session):
    """Stop children whose test never ran (a session stopped early)."""
    children = getattr(session.config, "interpreter_children", None)
    if children is not None:
        children.stop()


@pytest.fixture(scope="session")
def smollm2():
    """(our LLM on SmolLM2-135M GGUF, transformers' model of the same file, transformers' parsed
    config). Loaded once per session: each load takes seconds."""
    import torch
    from transformers import LlamaConfig

    from hifc import LLM
    from tests.fixtures import hf_model_from_gguf, smollm2_gguf_path

    llm = LLM("smollm2-135m", device="cpu", block_size=16, max_model_len=512)
    arch = llm.engine.arch
    config = LlamaConfig(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim, rms_norm_eps=arch.rms_norm_eps, rope_theta=arch.rope_theta,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings, bos_token_id=1, eos_token_id=None)
    hf, parsed = hf_model_from_gguf(smollm2_gguf_path(), torch.float32, config=config)
    hf.generation_config.eos_token_id = None  # run on past EOS, like ignore_eos=True
    return llm, hf, parsed


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def assert_png():
    """Check that a path holds a PNG image of more than ``min_bytes`` bytes (each caller passes
    the minimum that rules out a trivial image for its plots)."""
    def check(path, min_bytes: int) -> None:
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
        assert len(data) > min_bytes, f"{path} is suspiciously small ({len(data)} bytes)"
    return check
