"""How decode attention splits sequences over partitions (paged_attention._partitions): about
TARGET_PROGRAMS programs in all (one wave of the GPU: more partitions only add partial results to write
and merge, stop 30's sweep), never more partitions than the table has blocks, at least one."""

import pytest

pytest.importorskip("triton")
from ninfer_run.kernels.paged_attention import TARGET_PROGRAMS, _partitions  # noqa: E402


@pytest.mark.parametrize("sequences", [1, 2, 8])
def test_decode_fills_about_the_target_programs(sequences):
    programs = sequences * 4  # the 27B's 4 KV heads, one query block each
    parts = _partitions(programs, max_blocks=4096)
    assert parts * programs <= TARGET_PROGRAMS < (parts + 1) * programs


def test_never_more_partitions_than_blocks_nor_fewer_than_one():
    assert _partitions(4, max_blocks=3) == 3
    assert _partitions(1640, max_blocks=1563) == 1  # a long prefill chunk: one pass, partials the size of its output
