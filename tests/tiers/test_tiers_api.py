"""The KVTier contract: reserve/submit/poll/wait/free semantics, pinning and bad input."""
import threading

import pytest
import torch

from hifc.tiers import ErrorKind, JobStatus, KVGeometry, TierConfig, geometry_of, make_tier
from tests.tiers.tier_helpers import SMALL, gated, random_kv


def test_reserve_and_can_reserve(flash):
    tier = flash(num_blocks=8)
    assert tier.can_reserve(8) and not tier.can_reserve(9)
    assert tier.num_free_blocks == 8  # checking changed nothing
    ids = tier.reserve(5)
    assert ids == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="only 3 of 8 are free"):
        tier.reserve(4)
    tier.free(ids)
    with pytest.raises(ValueError, match="not reserved"):
        tier.free(ids[:1])


def test_tier_full_is_a_job_error_reported_once(flash):
    tier = flash(num_blocks=4)
    kv = random_kv(SMALL, 6)
    job = tier.swap_out_blocks(kv, range(6), owner=(1, 0))
    assert job.status is JobStatus.FAILED and job.error_kind is ErrorKind.TIER_FULL
    assert "6 blocks needed, 4 of 4 free" in job.error
    assert tier.poll() == [job] and tier.poll() == []
    ok = tier.swap_out_blocks(kv, range(4), owner=(1, 0))
    assert tier.wait(ok).ok and ok.tier_blocks == [0, 1, 2, 3]
    assert ok.nbytes == 4 * SMALL.block_bytes and ok.latency_s >= 0


def test_poll_reports_each_job_once(flash):
    tier = flash(num_blocks=16)
    kv = random_kv(SMALL, 8)
    jobs = [tier.swap_out_blocks(kv, [i], owner=(i, 0)) for i in range(6)]
    waited = tier.wait(jobs[0])
    assert waited is jobs[0] and waited.ok
    seen = []
    for _ in range(1000):
        seen += tier.poll()
        if len(seen) == 5:
            break
        threading.Event().wait(0.005)
    assert sorted(j.job_id for j in seen) == [j.job_id for j in jobs[1:]]
    assert all(j.ok for j in seen) and tier.poll() == []


def test_free_while_in_flight_is_deferred(flash):
    tier = flash(num_blocks=4)
    io = gated(tier)
    kv = random_kv(SMALL, 4)
    ids = tier.reserve(2)
    job = tier.submit_swap_out(kv, list(zip([0, 1], ids)), owner=(1, 0))
    assert tier.poll() == [] and not job.done
    tier.free(ids)  # e.g. the request was aborted
    assert tier.num_free_blocks == 2  # not reusable while I/O is in flight
    assert tier.reserve(2) == [2, 3]
    for misuse in (lambda: tier.free(ids),
                   lambda: tier.submit_swap_in(kv, list(zip(ids, [2, 3])), owner=(1, 0))):
        with pytest.raises(ValueError, match="not reserved"):
            misuse()  # freed already (deferred)
    io.gate.set()
    tier.wait(job)
    assert job.ok and tier.num_free_blocks == 2  # the deferred free happened


def test_swap_in_during_swap_out_is_busy(flash):
    tier = flash(num_blocks=4)
    io = gated(tier)
    kv = random_kv(SMALL, 4)
    ids = tier.reserve(2)
    out = tier.submit_swap_out(kv, list(zip([0, 1], ids)), owner=(1, 0))
    busy = tier.submit_swap_in(kv, list(zip(ids, [2, 3])), owner=(1, 0))
    assert busy.status is JobStatus.FAILED and busy.error_kind is ErrorKind.BUSY
    io.gate.set()
    assert tier.wait(out).ok
    later = tier.wait(tier.submit_swap_in(kv, list(zip(ids, [2, 3])), owner=(1, 0)))
    assert later.ok and torch.equal(kv[:, :, 2:4], kv[:, :, 0:2])


def test_close_waits_for_jobs_in_flight(flash):
    tier = flash(num_blocks=4)
    io = gated(tier)
    kv = random_kv(SMALL, 4)
    job = tier.swap_out_blocks(kv, [0, 1], owner=(1, 0))
    threading.Timer(0.05, io.gate.set).start()
    tier.close()
    assert job.ok
    with pytest.raises(ValueError, match="closed"):
        tier.reserve(1)


def test_empty_swap_is_ok(flash):
    tier = flash(num_blocks=4)
    job = tier.submit_swap_out(random_kv(SMALL, 2), [], owner=(1, 0))
    assert tier.wait(job).ok and job.nbytes == 0


def test_bad_input_raises_clear_value_errors(flash):
    tier = flash(num_blocks=8)
    kv = random_kv(SMALL, 4)
    ids = tier.reserve(2)
    pairs = list(zip([0, 1], ids))
    cases = [
        (kv[:, :, :, :8], pairs, (1, 0), "does not match the tier geometry"),
        (kv.float(), pairs, (1, 0), "dtype"),
        (kv[0], pairs, (1, 0), "6-D"),
        (kv, [(0, 7)], (1, 0), "tier block 7 is not reserved"),
        (kv, [(9, ids[0])], (1, 0), "out of range"),
        (kv, [(0, ids[0]), (1, ids[0])], (1, 0), "repeat"),
        (kv, [(0, ids[0], 1)], (1, 0), "pairs"),
        (kv, [(0.5, ids[0])], (1, 0), "pairs"),
        (kv, pairs, (1,), "owner"),
        (kv, pairs, (1, -1), "generation"),
    ]
    for cache, bad_pairs, owner, message in cases:
        with pytest.raises(ValueError, match=message):
            tier.submit_swap_out(cache, bad_pairs, owner)
    assert tier.poll() == [] and tier.num_free_blocks == 6  # nothing changed


def test_config_validation():
    with pytest.raises(ValueError, match="exactly one of flash_size_gib and num_tier_blocks"):
        TierConfig(kv_offload="flash", flash_path="x", flash_size_gib=1, num_tier_blocks=4)
    with pytest.raises(ValueError, match="exactly one"):
        TierConfig(kv_offload="flash", flash_path="x")
    with pytest.raises(ValueError, match="policy"):
        TierConfig(kv_offload="flash", flash_path="x", num_tier_blocks=4, flash_policy="lru")
    with pytest.raises(ValueError, match="layout"):
        TierConfig(kv_offload="flash", flash_path="x", num_tier_blocks=4, flash_layout="zigzag")
    with pytest.raises(ValueError, match="backend"):
        TierConfig(kv_offload="flash", flash_path="x", num_tier_blocks=4, flash_backend="spdk")
    with pytest.raises(ValueError, match="kv_offload"):
        TierConfig(kv_offload="hbm", num_tier_blocks=4)
    with pytest.raises(ValueError, match="io_threads"):
        TierConfig(kv_offload="flash", flash_path="x", num_tier_blocks=4, flash_io_threads=0)
    with pytest.raises(ValueError, match="KVGeometry"):
        make_tier(TierConfig(kv_offload="flash", flash_path="x", num_tier_blocks=4), (1, 2, 3))
    with pytest.raises(ValueError, match="kvikio"):
        if torch.cuda.is_available():
            pytest.skip("CUDA present")
        make_tier(TierConfig(kv_offload="flash", flash_path="/nonexistent/x", num_tier_blocks=4,
                             flash_backend="kvikio"), SMALL)


def test_geometry_of():
    kv = torch.zeros(3, 2, 5, 16, 4, 8, dtype=torch.bfloat16)
    assert geometry_of(kv) == KVGeometry(3, 4, 8, 16, "bfloat16")
    with pytest.raises(ValueError, match="kv_cache"):
        geometry_of(torch.zeros(3, 3, 5, 16, 4, 8))


def test_everything_free_at_the_end(flash):
    tier = flash(num_blocks=16, policy="left-append")
    kv = random_kv(SMALL, 8)
    held = []
    for i in range(10):
        job = tier.wait(tier.swap_out_blocks(kv, [i % 8, (i + 1) % 8], owner=(i, 0)))
        held.append(job)
        if len(held) > 3:
            old = held.pop(0)
            back = tier.wait(tier.submit_swap_in(kv, list(zip(old.tier_blocks, [6, 7])),
                                                 old.owner))
            assert back.ok, back.error
            tier.free(old.tier_blocks)
    for job in held:
        tier.free(job.tier_blocks)
    stats = tier.stats()
    assert tier.num_free_blocks == 16 and stats["inflight_blocks"] == 0
    assert stats["pending_jobs"] == 0 and stats["swap_out_ok"] == 10


@pytest.mark.parametrize("gds, device, expected", [(True, "cuda", "kvikio"),
                                                    (False, "cuda", "posix"),
                                                    (True, "cpu", "posix")])
def test_auto_backend_is_kvikio_only_where_gds_works(monkeypatch, gds, device, expected):
    from hifc.tiers.flash import mover as flash
    monkeypatch.setattr(flash, "gds_available", lambda: gds)
    assert flash.resolve_backend("auto", device) == expected
    assert flash.resolve_backend("posix", device) == "posix"
    with pytest.raises(ValueError, match="unknown I/O backend"):
        flash.resolve_backend("spdk", device)
