"""Run under torchrun (2 processes): rank 0 prints TP=2 greedy token ids as JSON; rank 1 serves
as its worker and leaves when the engine closes (test_tensor_parallel starts it)."""
import json
import sys

from hifc import LLM, SamplingParams


def main(model: str) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    with LLM(model, device="cpu", num_gpu_blocks=16, block_size=16,
             tensor_parallel_size=2) as llm:
        outputs = [o.token_ids for o in llm.generate([[1, 5, 9, 13]], params, use_tqdm=False)]
    print(json.dumps(outputs))


if __name__ == "__main__":
    main(sys.argv[1])
