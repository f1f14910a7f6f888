"""The host-transfer kernels (hifc.layers.triton_host_io): a packed step loaded into its device
buffer with its pending ids read on the device and only the block table entries its sequences
reach, and small tensors written into pinned memory. In Triton's interpreter on the CPU
(TRITON_INTERPRET=1; tests/test_triton_interpreter.py runs it in a child pytest), where host and
device memory are the same, and compiled on CUDA (marked gpu) from pinned memory."""
import numpy as np
import pytest
import torch

from hifc.core.scheduler import PENDING_TOKEN
from hifc.layers import triton_host_io
from hifc.runtime.inputs import (ChunkInputLayout, DecodeInputLayout, write_chunk_inputs,
                                 write_decode_inputs)
from tests.layers.triton_devices import DEVICES
from tests.runtime.helpers import chunk_work, decode_work

BLOCK_SIZE = 4
UNTOUCHED = -7  # what the device buffer holds where the load writes nothing


def host_buffer(numel: int, device: str) -> torch.Tensor:
    return torch.zeros(numel, dtype=torch.int32, pin_memory=device == "cuda")


def with_tokens(work, tokens):
    """``work`` with each decode's token replaced (PENDING_TOKEN: sampled by the step before)."""
    return [w._replace(token_ids=[t]) for w, t in zip(work, tokens)] + work[len(tokens):]


def load(layout, write, work, batch, pending, sampled, device):
    """Pack ``work`` with ``pending`` ({index: row of ``sampled``}) as the decode graphs do
    and load it into a device buffer that held UNTOUCHED; (host array, device array)."""
    host = host_buffer(layout.numel, device)
    write(work, batch, BLOCK_SIZE, layout, host.numpy())
    for index, row in pending.items():
        host[index] = -1 - row
    dev = torch.full((layout.numel,), UNTOUCHED, dtype=torch.int32, device=device)
    triton_host_io.load_packed(host, dev, sampled.to(device), block_size=BLOCK_SIZE,
                               **layout.load_fields(batch))
    return host.numpy().copy(), dev.cpu().numpy()


def expected(host, layout, seq_lens, pending, sampled):
    """The device buffer a load should leave: the header with the pending ids in place, and
    ceil(seq_len / BLOCK_SIZE) entries of each table row, the rest UNTOUCHED."""
    want = np.full(layout.numel, UNTOUCHED, dtype=np.int32)
    head = layout.block_tables_offset
    want[:head] = host[:head]
    for index, row in pending.items():
        want[index] = sampled[row]
    for row, seq_len in enumerate(seq_lens):
        start = head + row * layout.max_blocks
        used = -(-seq_len // BLOCK_SIZE)
        want[start:start + used] = host[start:start + used]
    return want


@pytest.mark.parametrize("device", DEVICES)
def test_a_decode_step_loads_with_its_pending_ids_and_the_tables_it_reaches(device):
    layout = DecodeInputLayout(max_batch=8, max_blocks=1200)  # rows wider than one pass
    work = with_tokens(decode_work([10, 1, 4401, 3], BLOCK_SIZE),
                       [PENDING_TOKEN, 17, PENDING_TOKEN, PENDING_TOKEN])
    sampled = torch.tensor([11, 22, 33, 2**31 - 1])
    pending = {0: 2, 2: 0, 3: 3}  # the previous step's rows, in any order
    host, dev = load(layout, write_decode_inputs, work, 6, pending, sampled, device)
    seq_lens = [10, 1, 4401, 3, 1, 1]  # two padding rows of one key
    assert dev.tolist() == expected(host, layout, seq_lens, pending, sampled.tolist()).tolist()
    assert dev[:6].tolist() == [33, 17, 11, 2**31 - 1, 0, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_a_step_without_pending_ids_and_a_chunk_step_load(device):
    layout = ChunkInputLayout(max_batch=4, max_blocks=40, chunk=8)
    work = with_tokens(chunk_work([31], 60, 5, BLOCK_SIZE), [PENDING_TOKEN])
    sampled = torch.tensor([41])
    host, dev = load(layout, write_chunk_inputs, work, 2, {0: 0}, sampled, device)
    # two decode rows (one padding), the chunk's 65 tokens, the padding sequence's 4
    seq_lens = [31, 1, 65, 4]
    assert dev.tolist() == expected(host, layout, seq_lens, {0: 0}, [41]).tolist()
    decodes = DecodeInputLayout(max_batch=2, max_blocks=5)
    host, dev = load(decodes, write_decode_inputs, decode_work([5], BLOCK_SIZE), 1, {},
                     torch.zeros(1, dtype=torch.long), device)
    assert dev.tolist() == expected(host, decodes, [5], {}, []).tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_load_refuses_what_does_not_fit(device):
    layout = DecodeInputLayout(max_batch=2, max_blocks=5)
    host, sampled = host_buffer(layout.numel, device), torch.zeros(1, dtype=torch.long,
                                                                    device=device)
    short = torch.zeros(layout.numel - 1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="does not fit"):
        triton_host_io.load_packed(host, short, sampled, block_size=4, **layout.load_fields(2))
    with pytest.raises(ValueError, match="int64 pending ids"):
        triton_host_io.load_packed(host, host.to(device), sampled.int(), block_size=4,
                                   **layout.load_fields(2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [0, 1, 3, 1500])
def test_store_to_host_writes_the_first_elements(device, n):
    dst = torch.full((1600,), -1, dtype=torch.long, pin_memory=device == "cuda")
    src = torch.arange(n, dtype=torch.long, device=device) * 7
    out = triton_host_io.store_to_host(src, dst)
    if device == "cuda":
        torch.cuda.synchronize()
    assert out.shape == (n,) and (n == 0 or out.data_ptr() == dst.data_ptr())
    assert dst[:n].tolist() == src.tolist() and dst[n:].eq(-1).all()
    with pytest.raises(ValueError, match="at least its size"):
        triton_host_io.store_to_host(torch.zeros(1601, dtype=torch.long, device=device), dst)
    with pytest.raises(ValueError, match="its dtype"):
        triton_host_io.store_to_host(torch.zeros(2, dtype=torch.int32, device=device), dst)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned memory)")
def test_host_slots_hand_out_buffers_in_turn_and_catch_a_late_read():
    from hifc.runtime.step_result import HostSlots
    slots = HostSlots(rows=4, count=2)
    first = slots.store(torch.tensor([5, 6], device="cuda"))
    second = slots.store(torch.tensor([7], device="cuda"))
    torch.cuda.synchronize()
    assert first[0].tolist() == [5, 6] and second[0].tolist() == [7]
    slots.check(first[1])
    assert slots.store(torch.zeros(5, dtype=torch.long, device="cuda")) is None  # too many rows
    slots.store(torch.tensor([8], device="cuda"))  # the first's buffer again
    with pytest.raises(RuntimeError, match="read after 2 later steps"):
        slots.check(first[1])
    slots.check(second[1])
