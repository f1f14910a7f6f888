import itertools

import pytest

from hifc.tiers.flash.layout import (ALIGN, BLOCK_RECORD, LAYER_KV, LAYOUTS, blocks_for_bytes,
                                     make_layout)
from hifc.tiers.geometry import KVGeometry

GEOMETRIES = [
    KVGeometry(4, 8, 128, 64, "float16"),  # 128 KiB slices
    KVGeometry(3, 2, 5, 3, "bfloat16"),  # 60-byte slices: padded to 4 KiB slots
    KVGeometry(2, 1, 64, 16, "float32"),  # exactly 4 KiB
    KVGeometry(1, 3, 96, 7, "float32"),
]


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_every_offset_aligned_and_disjoint(name, geometry):
    n = 9
    layout = make_layout(name, geometry, n)
    extents = [(0, ALIGN)]  # superblock
    for b in range(n):
        h = layout.header_file_offset(b)
        assert h % ALIGN == 0
        extents.append((h, h + ALIGN))
        for layer, kind in itertools.product(range(geometry.num_layers), (0, 1)):
            off = layout.data_file_offset(layer, kind, b)
            assert off % ALIGN == 0
            extents.append((off, off + geometry.slice_bytes))
    extents.sort()
    for (a0, a1), (b0, _) in zip(extents, extents[1:]):
        assert a1 <= b0, "regions overlap"
    assert extents[-1][1] <= layout.file_bytes
    assert layout.file_bytes % ALIGN == 0


def test_layer_kv_is_the_papers_formula():
    g = KVGeometry(4, 8, 128, 64, "float16")
    n = 10
    layout = make_layout(LAYER_KV, g, n)
    bsb = g.slice_bytes  # H x S x D x T, already a 4 KiB multiple
    assert bsb == 8 * 64 * 128 * 2
    for layer, kind, b in itertools.product(range(4), (0, 1), range(n)):
        expected = layout.data_base + layer * (2 * n * bsb) + kind * (n * bsb) + b * bsb
        assert layout.data_file_offset(layer, kind, b) == expected


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_chunk_plan_runs_are_aligned_and_match_offsets(name, geometry):
    layout = make_layout(name, geometry, 12)
    for first, n in [(0, 1), (3, 4), (0, 12), (11, 1)]:
        plan = layout.chunk_plan(first, n)
        covered = 0
        for file_off, stage_off, length in plan.runs:
            assert file_off % ALIGN == 0 and stage_off % ALIGN == 0 and length % ALIGN == 0
            assert stage_off + length <= plan.staging_bytes
            covered += length
        assert covered == plan.staging_bytes
        runs = sorted(plan.runs, key=lambda r: r[1])

        def file_offset_of(stage):
            for file_off, stage_off, length in runs:
                if stage_off <= stage < stage_off + length:
                    return file_off + stage - stage_off
            raise AssertionError("staging offset outside every run")

        for i in range(n):
            assert file_offset_of(plan.header_offset + i * plan.header_stride) == \
                layout.header_file_offset(first + i)
            for layer, kind in itertools.product(range(geometry.num_layers), (0, 1)):
                assert file_offset_of(plan.slice_offset(i, layer, kind)) == \
                    layout.data_file_offset(layer, kind, first + i)


def test_run_counts():
    g = KVGeometry(4, 8, 128, 64, "float16")
    assert len(make_layout(BLOCK_RECORD, g, 8).chunk_plan(2, 5).runs) == 1
    assert len(make_layout(LAYER_KV, g, 8).chunk_plan(2, 5).runs) == 2 * 4 + 1


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="dtype"):
        KVGeometry(1, 1, 1, 1, "int8")
    with pytest.raises(ValueError, match="num_layers"):
        KVGeometry(0, 1, 1, 1, "float16")
    with pytest.raises(ValueError, match="header capacity"):
        make_layout(BLOCK_RECORD, KVGeometry(1000, 1, 1, 1, "float16"), 4)
    with pytest.raises(ValueError, match="unknown layout"):
        make_layout("zigzag", GEOMETRIES[0], 4)
    with pytest.raises(ValueError, match="out of range"):
        make_layout(BLOCK_RECORD, GEOMETRIES[0], 4).chunk_plan(3, 2)


def test_blocks_for_bytes():
    g = GEOMETRIES[0]
    layout = make_layout(BLOCK_RECORD, g, 1)
    n = blocks_for_bytes(BLOCK_RECORD, g, 10 * layout.per_block_file_bytes + 4096)
    assert n == 10
    assert make_layout(BLOCK_RECORD, g, n).file_bytes == 10 * layout.per_block_file_bytes + 4096
