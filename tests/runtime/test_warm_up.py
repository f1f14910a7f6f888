"""The runner's start-up warm-up steps (``ModelRunner.warm_up``): prompts run into the cache's
first blocks before any sequence holds one, leaving nothing a later request sees."""
import pytest
import torch

from hifc import LLMEngine, SamplingParams
from hifc.layers.tensor_parallel import TPShard
from hifc.layers.triton_attention import MAX_BLOCK_M, warm_up_shapes
from hifc.runtime.model_runner import SAMPLER_WARM_UP, warm_up_steps

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = [[3 + (7 * i + j) % 500 for j in range(n)] for i, n in enumerate((1, 5, 40, 130))]
BLOCK = 16


def engine(**options) -> LLMEngine:
    return LLMEngine.from_options("random:tiny-llama", device="cpu", dtype="float32",
                                  num_gpu_blocks=64, block_size=BLOCK, **options)


def generate(llm: LLMEngine) -> list[list[int]]:
    for i, prompt in enumerate(PROMPTS):
        llm.add_request(str(i), prompt, GREEDY)
    done = {}
    while llm.has_unfinished_requests():
        for out in llm.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    return [done[str(i)] for i in range(len(PROMPTS))]


def test_warm_up_writes_only_its_blocks_and_changes_no_later_output():
    plain, warmed = engine(), engine()
    cache = warmed.runner.kv_cache  # [L, 2, NB, BS, Hkv, D]
    before = cache.clone()
    warmed.runner.warm_up(warmed.limits.max_model_len)  # on the CPU: no steps by default
    assert torch.equal(cache, before)
    # prompts, and chunks after cached contexts (whose block tables repeat the first block)
    warmed.runner.warm_up(warmed.limits.max_model_len,
                          steps=[(0, 2), (0, 17), (0, 130), (64, 40), (256, 20)])
    used = -(-130 // BLOCK)
    assert not torch.equal(cache[:, :, :used], before[:, :, :used])
    assert torch.equal(cache[:, :, used:], before[:, :, used:])
    assert generate(warmed) == generate(plain)


def test_start_up_runs_the_last_layer_on_each_row_count_of_the_small_m_kernel(monkeypatch):
    # An eager step's last layer projects the rows that sample, one per such sequence: the
    # start-up's steps of 2, 16, 25 and 32 two-token prompts (at most max_num_seqs) meet each
    # variant of the small-M kernel those rows take (row_variants), before the one-prompt steps.
    plain, warmed = engine(), engine()
    runner = warmed.runner
    monkeypatch.setattr(runner, "_warm_up_steps", lambda max_model_len: [(0, 2)])
    layers = runner.model.model.layers

    def o_proj_rows(max_num_seqs):
        rows = {"first": [], "last": []}
        hooks = [layer.self_attn.o_proj.register_forward_hook(
            lambda module, args, out, name=name: rows[name].append(args[0].shape[0]))
            for name, layer in (("first", layers[0]), ("last", layers[-1]))]
        try:
            runner.start_up(warmed.limits.max_model_len, max_num_seqs, 64, tune=False,
                            capture=False)
        finally:
            for hook in hooks:
                hook.remove()
        return rows

    assert o_proj_rows(32) == {"first": [4, 32, 50, 64, 2], "last": [2, 16, 25, 32, 1]}
    assert o_proj_rows(20) == {"first": [4, 32, 2], "last": [2, 16, 1]}
    assert generate(warmed) == generate(plain)


def test_warm_up_steps_fit_the_model_length_and_the_cache():
    def triton_steps(max_model_len, num_slots):  # the Triton attention's shapes
        return warm_up_steps(warm_up_shapes(), max_model_len, num_slots)

    everything = triton_steps(1 << 20, 1 << 20)
    chunks = [2, 4, 8, 16, 32, 64, MAX_BLOCK_M]  # each size of q block
    assert everything == [(c, n) for c in (0, 4096, 8192, 16384, 32768) for n in chunks]
    assert triton_steps(8192, 1 << 20) == [(c, n) for c, n in everything if c + n <= 8192]
    assert max(c for c, _ in triton_steps(8192, 1 << 20)) == 4096
    assert triton_steps(100, 1 << 20) == [(0, n) for n in (2, 4, 8, 16, 32, 64)]
    # the context re-reads the first block: only the new tokens need slots
    assert triton_steps(1 << 20, 16) == [(c, n) for c, n in everything if n <= 16]
    # a backend that compiles nothing (the torch reference): one step, for the sampler's passes
    assert warm_up_steps([], 1 << 20, 1 << 20) == SAMPLER_WARM_UP


def test_warm_up_refuses_a_context_of_part_blocks():
    llm = engine()
    with pytest.raises(ValueError, match="not whole blocks"):
        llm.runner.warm_up(llm.limits.max_model_len, steps=[(40, 8)])


@pytest.mark.parametrize("tp_size", [1, 2])
def test_warm_up_reruns_only_the_steps_that_met_new_kernel_variants(monkeypatch, tp_size):
    # Stand-in for Triton's deferral: each step "meets" the variants of its token count.
    import contextlib

    import hifc.layers.triton_jit as triton_jit
    llm = engine()
    runner = llm.runner
    variants = {2: ["a", "b"], 4: ["a"], 8: ["b", "c"], 16: []}
    met, calls = {}, []
    deferring = []

    @contextlib.contextmanager
    def deferral(meanwhile=None):
        deferring.append(True)
        yield met
        deferring.pop()
        assert meanwhile is None

    def logits(step):
        n = len(step[0].token_ids)
        calls.append((n, bool(deferring)))
        if deferring:
            met.update(dict.fromkeys(variants[n]))
        return torch.zeros(1, llm.arch.vocab_size)

    monkeypatch.setattr(triton_jit, "deferred_compiles", deferral)
    monkeypatch.setattr(runner, "eager_logits", logits)
    monkeypatch.setattr(runner.model, "tp", TPShard(size=tp_size))
    runner.warm_up(llm.limits.max_model_len, steps=[(0, 2), (0, 4), (0, 8), (0, 16)])
    deferred = [(n, True) for n in (2, 4, 8, 16)]
    if tp_size == 1:  # again only the steps that met a variant first (2: a, b; 8: c)
        assert calls == deferred + [(2, False), (8, False)]
    else:  # every step again on every rank: what each met depends on what it compiled before
        assert calls == deferred + [(n, False) for n in (2, 4, 8, 16)]


class FakeGraphs:
    """The padded forwards as ``ModelRunner.start_up`` drives them: three forwards, each
    meeting the variants ``variants`` names, and a capture that records what it is told."""

    num_forwards = 3

    def __init__(self, log, meet):
        self.log, self.meet = log, meet

    def forward_parts(self, capture):
        self.log.append(("parts", capture))
        for index in range(self.num_forwards):
            yield lambda index=index: self.meet(f"forward {index}")

    def capture(self, again):
        self.log.append(("capture", list(again)))


@pytest.mark.parametrize("tp_size", [1, 2])
@pytest.mark.parametrize("capture", [True, False])
def test_start_up_tunes_while_the_met_variants_compile_then_reruns_and_captures(
        monkeypatch, tp_size, capture):
    # Stand-in for Triton's deferral: each pass "meets" the variants named for it; the GEMM
    # tuning must run after every pass met its kernels (while they compile), and the capture
    # and the reruns after it.
    import contextlib

    import hifc.layers.triton_jit as triton_jit
    llm = engine()
    runner = llm.runner
    variants = {"forward 0": ["a"], "forward 1": ["a"], "forward 2": ["b"], "rows 2": ["f"],
                "step 2": ["a", "c"], "step 4": ["d"], "step 8": [], "passes": ["e"]}
    met, log, deferring = {}, [], []

    def meet(name):
        log.append((name, bool(deferring)))
        if deferring:
            met.update(dict.fromkeys(variants[name]))

    @contextlib.contextmanager
    def deferral(meanwhile=None):
        deferring.append(True)
        yield met
        deferring.pop()
        log.append("compiles start")
        meanwhile()
        log.append("compiles joined")

    graphs = FakeGraphs(log, meet)
    monkeypatch.setattr(triton_jit, "deferred_compiles", deferral)
    monkeypatch.setattr(runner, "_padded_decode_graphs", lambda *args: graphs)
    monkeypatch.setattr(runner, "_warm_up_steps", lambda max_model_len: [(0, 2), (0, 4), (0, 8)])
    monkeypatch.setattr(runner, "eager_logits",  # first a step of 2 prompts (max_num_seqs 8)
                        lambda step: meet(f"rows {len(step)}" if len(step) > 1
                                          else f"step {len(step[0].token_ids)}")
                        or torch.zeros(1, llm.arch.vocab_size))
    monkeypatch.setattr(runner.sampler, "warm_up", lambda logits: meet("passes"))
    monkeypatch.setattr(runner, "tune_projections", lambda *args: log.append(("tune", args)))
    monkeypatch.setattr(runner.model, "tp", TPShard(size=tp_size))
    runner.start_up(llm.limits.max_model_len, 8, 64, tune=True, capture=capture)
    met_first = [(name, True) for name in
                 ("forward 0", "forward 1", "forward 2", "rows 2", "step 2", "step 4", "step 8",
                  "passes")]
    if tp_size == 1:  # again: the passes that met a variant no pass before them met
        forwards, reruns = [0, 2], ["rows 2", "step 2", "step 4", "passes"]
    else:  # every pass again on every rank
        forwards, reruns = [0, 1, 2], ["rows 2", "step 2", "step 4", "step 8", "passes"]
    assert log == ([("parts", capture)] + met_first
                   + ["compiles start", ("tune", (8, 64)), "compiles joined"]
                   + ([("capture", forwards)] if capture else [])
                   + [(name, False) for name in reruns])
    assert runner.decode_graphs is graphs
