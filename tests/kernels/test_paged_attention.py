"""Paged INT8 attention (Triton) against the pure-torch path (pool.read + causal_attention):
decode, MTP verification and chunked prefill, GQA, ragged lengths, fresh random KV."""

import pytest
import torch

from ninfer_run.kv.pool import BlockPool, KVLayout

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere
import triton.language as tl  # noqa: E402

from ninfer_run.kernels.paged_attention import _dequant, paged_attention, reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
HEADS = (12, 2, 128) if DEVICE == "cpu" else (24, 4, 256)  # (Hq, Hkv, D): two scale groups per head on the CPU, the 27B's GQA 6 on the GPU
# the paged kernel's dots take fp16 operands whatever q's dtype (bf16 q converts exactly): a bound for
# fp16, which a bf16 kernel's error (3.2e-3 at the 27B's heads on the H100, stop 31) does not meet
PAGED_ERROR = 2e-3


def _setup(lengths, seed, block_size=16, spare_width=0):
    """`spare_width`: table columns past the longest sequence (a captured step's tables span the pool)."""
    hq, hkv, dim = HEADS
    g = torch.Generator().manual_seed(seed)
    blocks_each = [-(-n // block_size) for n in lengths]
    pool = BlockPool(KVLayout(2, hkv, dim, block_size, "int8"), sum(blocks_each) + 3)
    tables = []
    for n, nb in zip(lengths, blocks_each):
        table = pool.allocate(nb)[::-1]  # blocks out of order, as after eviction
        k = torch.randn(n, hkv, dim, generator=g) * 2
        v = torch.randn(n, hkv, dim, generator=g)
        pool.write(1, table, 0, k, v)
        tables.append(table)
    width = max(blocks_each) + spare_width
    padded = torch.tensor([t + [t[0]] * (width - len(t)) for t in tables], dtype=torch.int32)
    for name in ("k", "v", "k_scale", "v_scale"):
        setattr(pool, name, getattr(pool, name).to(DEVICE))
    return pool, tables, padded.to(DEVICE), torch.tensor(lengths, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("lengths,q_len,parts", [([1], 1, None), ([37, 200, 64], 1, None), ([37, 200, 64], 1, 4),
                                                 ([50, 131], 4, 3), ([300], 37, None), ([300], 37, 5), ([300], 150, 1)])
def test_matches_reference(lengths, q_len, parts):
    """parts: flash-decoding partitions (None: the kernel's own choice; 1: one pass, as long prefills)."""
    pool, tables, padded, lens = _setup(lengths, sum(lengths) + q_len)
    hq, _, dim = HEADS
    q = torch.randn(len(lengths), q_len, hq, dim, generator=torch.Generator().manual_seed(q_len))
    got = paged_attention(q.to(DEVICE, DTYPE), pool, 1, padded, lens, parts=parts)
    for name in ("k", "v", "k_scale", "v_scale"):
        setattr(pool, name, getattr(pool, name).cpu())
    want = reference(q.to(DTYPE).float(), pool, 1, tables, lengths)
    err = float((got.cpu() - want).norm() / want.norm())
    assert not torch.isnan(got).any() and err < PAGED_ERROR, err


def _one_shape_error(length, q_len, seed=0):
    pool, tables, padded, lens = _setup([length], seed)
    hq, _, dim = HEADS
    q = torch.randn(1, q_len, hq, dim, generator=torch.Generator().manual_seed(seed + q_len))
    got = paged_attention(q.to(DEVICE, DTYPE), pool, 1, padded, lens, one_shape=True)
    for name in ("k", "v", "k_scale", "v_scale"):
        setattr(pool, name, getattr(pool, name).cpu())
    want = reference(q.to(DTYPE).float(), pool, 1, tables, [length])
    return float((got.cpu() - want).norm() / want.norm()), got


@pytest.mark.parametrize("length,q_len", [(3, 3), (37, 1), (300, 37), (200, 64)])
def test_one_shape_matches_reference(length, q_len):
    """An eager short chunk's fixed shape (state.attend): more partitions than the sequence has blocks
    (the empty ones skipped by the merge), more query rows a program than the chunk has."""
    err, got = _one_shape_error(length, q_len)
    assert not torch.isnan(got).any() and err < PAGED_ERROR, err


@pytest.mark.skipif(DEVICE != "cuda", reason="Triton compiles on CUDA (its interpreter compiles nothing)")
def test_one_shape_compiles_once_for_any_chunk_and_table():
    from ninfer_run.kernels.common import counting_compiles

    _one_shape_error(300, 37)
    with counting_compiles() as compiled:
        for length, q_len in ((3, 3), (37, 1), (1000, 17), (4097, 64), (130, 5)):
            assert _one_shape_error(length, q_len, seed=length)[0] < PAGED_ERROR
    assert compiled is not None and not compiled, compiled


@pytest.mark.parametrize("lengths,q_len", [([37, 200], 1), ([50, 131], 4)])
def test_output_gate_in_the_merge_is_the_torch_gate(lengths, q_len):
    """Qwen3.5's output gate applied by the merge (the gate a strided view, as the model's q|gate split
    leaves it) == the ungated output cast to the activation dtype, then layers.output_gate."""
    from ninfer_run.layers import output_gate

    pool, _, padded, lens = _setup(lengths, 3 + q_len)
    hq, _, dim = HEADS
    g = torch.Generator().manual_seed(q_len)
    q = torch.randn(len(lengths), q_len, hq, dim, generator=g).to(DEVICE, DTYPE)
    qg = (torch.randn(len(lengths) * q_len, hq, 2 * dim, generator=g) * 3).to(DEVICE, DTYPE)
    gate = qg[..., dim:]
    got = paged_attention(q, pool, 1, padded, lens, gate=gate)
    want = output_gate(paged_attention(q, pool, 1, padded, lens).to(DTYPE).flatten(0, 1), gate)
    assert got.dtype == DTYPE and got.shape == (len(lengths), q_len, hq, dim)
    # the same rounding points; torch's and Triton's sigmoid may differ in the last bit
    err = float((got.flatten(0, 1).float() - want.float()).norm() / want.float().norm())
    assert err < 4e-3, err


def test_partitions_share_each_sequence_not_the_table():
    """A table 40 blocks wider than the sequences, 32 partitions: each sequence's blocks are spread over
    the partitions (a short one in a wide table must not fall to one of them), same result."""
    lengths = [37, 200, 64]
    pool, tables, padded, lens = _setup(lengths, 5, spare_width=40)
    hq, _, dim = HEADS
    q = torch.randn(len(lengths), 1, hq, dim, generator=torch.Generator().manual_seed(2))
    got = paged_attention(q.to(DEVICE, DTYPE), pool, 1, padded, lens, parts=32)
    for name in ("k", "v", "k_scale", "v_scale"):
        setattr(pool, name, getattr(pool, name).cpu())
    want = reference(q.to(DTYPE).float(), pool, 1, tables, lengths)
    err = float((got.cpu() - want).norm() / want.norm())
    assert not torch.isnan(got).any() and err < PAGED_ERROR, err


@triton.jit
def _dequant_probe(x_ptr, s_ptr, out_ptr, BS: tl.constexpr, D: tl.constexpr):
    rows = tl.arange(0, BS)
    out = _dequant(x_ptr, s_ptr, rows, rows < BS, BS, D)
    tl.store(out_ptr + rows[:, None] * D + tl.arange(0, D)[None, :], out)


def test_dequant_is_each_int8_times_its_group_scale_rounded_once_to_fp16():
    """The bit trick (an int8 byte under fp16's exponent of 1024) against the plain product: every int8
    value, scales from fp16 subnormal-producing to large, equal bit for bit to (x * s) rounded to fp16."""
    rows, dim = 64, 256
    g = torch.Generator().manual_seed(7)
    x = torch.arange(-128, 128, dtype=torch.int16).repeat(rows * dim // 256)[torch.randperm(rows * dim, generator=g)]
    x = x.to(torch.int8).view(rows, dim)
    scales = torch.exp(torch.empty(rows, dim // 64).uniform_(-16, 6, generator=g)).half()
    out = torch.empty(rows, dim, dtype=torch.float16, device=DEVICE)
    _dequant_probe[(1,)](x.to(DEVICE), scales.to(DEVICE), out, BS=rows, D=dim)
    want = (x.float() * scales.float().repeat_interleave(64, dim=1)).half()
    assert torch.equal(out.cpu(), want)


@pytest.mark.parametrize("mode", ["masked", "split-flash", "split-cudnn"])
@pytest.mark.parametrize("length,q_len", [(300, 100), (256, 256), (700, 65)])
def test_dense_prefill_matches_reference(length, q_len, mode):
    """The long-chunk path (KV decoded once, then flash attention): one SDPA call with a bottom-right
    causal mask (GQA), or the earlier keys and the chunk's own apart, merged by their log-sum-exps (on a
    CPU both backends are the float32 torch form: the merge is what is checked there)."""
    _check_dense_prefill(length, q_len, mode)


def _check_dense_prefill(length: int, q_len: int, mode: str) -> None:
    """dense_prefill of q_len queries ending a length-token sequence against the float32 reference."""
    from ninfer_run.kernels.paged_attention import dense_prefill

    pool, tables, _, _ = _setup([length], length + q_len)
    hq, _, dim = HEADS
    q = torch.randn(q_len, hq, dim, generator=torch.Generator().manual_seed(length)).to(DEVICE, DTYPE)
    got = dense_prefill(q, pool, 1, tables[0], length, mode).float().cpu()
    for name in ("k", "v", "k_scale", "v_scale"):
        setattr(pool, name, getattr(pool, name).cpu())
    want = reference(q[None].float().cpu(), pool, 1, tables, [length])[0]
    err = float((got - want).norm() / want.norm())
    assert err < (1e-2 if DTYPE == torch.bfloat16 else 2e-3), err


@pytest.mark.parametrize("mode", ["split-flash", "split-cudnn"])
def test_split_prefill_in_pieces_matches_reference(mode, monkeypatch):
    """A split chunk longer than SPLIT_ROWS attends in pieces, each over every key before it and its own:
    the same attention (100 queries after 300 keys in pieces of 48, 48 and 4)."""
    from ninfer_run.kernels import prefill_modes

    monkeypatch.setattr(prefill_modes, "SPLIT_ROWS", 48)
    _check_dense_prefill(400, 100, mode)


def test_merge_lse_is_the_torch_merge_on_strided_halves():
    """The split attention's merge (one Triton kernel, written into a slice of the chunk's output) against
    the float32 torch form, with the layouts the halves come in: a [T, G, D] view of a folded [T * G, D],
    b a transposed [G, T, D], log-sum-exps of both orders, and lse gaps wide enough that one half dominates."""
    from ninfer_run.kernels.paged_attention import merge_lse, merge_lse_reference

    t, g, dim = 37, 6, 128
    gen = torch.Generator().manual_seed(11)
    a = torch.randn(t * g, dim, generator=gen).to(DEVICE, DTYPE).view(t, g, dim)
    b = torch.randn(g, t, dim, generator=gen).to(DEVICE, DTYPE).transpose(0, 1)
    lse_a = (torch.randn(t, g, generator=gen) * 4).to(DEVICE)
    lse_b = (torch.randn(g, t, generator=gen) * 4).to(DEVICE).transpose(0, 1)
    lse_a[0, 0], lse_b[1, 1] = 60.0, 60.0  # one half's weight ~1, the other's ~e^-60
    chunk = torch.zeros(t, 3 * g, dim, dtype=DTYPE, device=DEVICE)
    merge_lse(a, lse_a, b, lse_b, chunk[:, g : 2 * g])
    want = merge_lse_reference(a, lse_a, b, lse_b)
    # the same float32 sums in another order: a last-bit rounding apart at most
    assert float((chunk[:, g : 2 * g].float() - want.float()).norm() / want.float().norm()) < 1e-4
    assert not chunk[:, :g].any() and not chunk[:, 2 * g :].any()  # only its slice written


def test_auto_prefill_attention_is_split_cudnn_on_hopper_only():
    from ninfer_run.kernels.prefill_modes import prefill_attention_mode

    assert prefill_attention_mode("auto", (9, 0)) == "split-cudnn"  # measured there (H100, stop 34)
    assert prefill_attention_mode("auto", (12, 0)) == prefill_attention_mode("auto", None) == "masked"
    assert prefill_attention_mode("split-flash", None) == "split-flash"


def test_a_cudnn_refusal_falls_back_to_the_masked_path(monkeypatch):
    """A GPU whose cuDNN has no fused attention for the shape: the chunk still gets its attention (the
    masked path's, bit for bit) and later chunks go straight to it."""
    from ninfer_run.kernels import paged_attention as pa
    from ninfer_run.kernels import prefill_modes

    def refusing(q, k, v, causal, backend):
        if backend == "cudnn":
            raise RuntimeError("no cuDNN engine for this graph")
        return lse(q, k, v, causal, backend)

    lse = pa.attention_lse
    monkeypatch.setattr(pa, "attention_lse", refusing)
    monkeypatch.setattr(prefill_modes, "cudnn_refused", [])
    pool, tables, _, _ = _setup([300], 5)
    hq, _, dim = HEADS
    q = torch.randn(100, hq, dim, generator=torch.Generator().manual_seed(5)).to(DEVICE, DTYPE)
    got = pa.dense_prefill(q, pool, 1, tables[0], 300, "split-cudnn")
    assert torch.equal(got, pa.dense_prefill(q, pool, 1, tables[0], 300, "masked"))
    assert prefill_modes.cudnn_refused and prefill_modes.prefill_attention_mode("split-cudnn", (9, 0)) == "masked"


@pytest.mark.skipif(DEVICE != "cuda", reason="an 8.9 GB pool: on the GPU only")
def test_a_pool_past_2_31_values_is_addressed_in_64_bits():
    """A KV pool of more than 2^31 values (the 27B's 16 layers x 4 heads x 256 from 131,072 tokens, a
    --max-context a 100K agent prompt or two exceeds): the fused write and the attention at its last
    blocks of its second layer == the same rows in a small pool, bit for bit (32-bit offsets wrapped there)."""
    from ninfer_run.kernels import kv_write

    layout = KVLayout(2, 1, 64, 16, "int8")  # 1,024 values a block and layer
    big = BlockPool(layout, 2**21 + 8, DEVICE)  # layer 1 starts at 2^31 + 8,192 values
    small = BlockPool(layout, 8, DEVICE)
    length, g = 100, torch.Generator().manual_seed(31)
    k = (torch.randn(length, 1, 64, generator=g) * 2).to(DEVICE, DTYPE)
    v = torch.randn(length, 1, 64, generator=g).to(DEVICE, DTYPE)
    blocks = -(-length // 16)
    tables = {"big": list(range(big.num_blocks - 1, big.num_blocks - 1 - blocks, -1)), "small": list(range(blocks))}
    q = torch.randn(1, 3, 2, 64, generator=g).to(DEVICE, DTYPE)
    out = {}
    for name, pool in (("big", big), ("small", small)):
        table = torch.tensor(tables[name], dtype=torch.int32, device=DEVICE)
        pos = torch.arange(length, device=DEVICE)
        kv_write.write_slots(pool, 1, table[pos // 16] * 16 + pos % 16, k, v)
        out[name] = paged_attention(q, pool, 1, table[None], torch.tensor([length], dtype=torch.int32, device=DEVICE))
    for name in ("k", "v", "k_scale", "v_scale"):
        assert torch.equal(getattr(big, name)[1, tables["big"]], getattr(small, name)[1, tables["small"]]), name
    assert torch.equal(out["big"], out["small"])
    del big
    torch.cuda.empty_cache()
