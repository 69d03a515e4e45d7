"""The CUDA C++ kernels (csrc/*.cu) as one torch extension, JIT-built on first use on a Hopper GPU.

Built with torch.utils.cpp_extension into a cache directory keyed by the sources, torch and CUDA
versions (NINFER_CACHE, else ~/.cache/ninfer), so a machine compiles once. CPU installs and GPUs
the sm_90a code cannot run on never build it; a failed build (no nvcc, say) warns once and the
callers keep their Triton kernels. NINFER_CUDA_KERNELS=0 turns the extension off.

  nvfp4_gemv   decode GEMV, NVFP4 weights x bf16 rows (M <= 16) -> bf16: csrc/quant_gemv_sm90.cu; reads
               the row-major codes or (the engine's) tile_nvfp4's layout; its reference is
               nvfp4_linear.reference. nvfp4_gemv_group: up to 3 weights of one x in one launch;
               nvfp4_norm_gemv_group: the same for one row that the launch first adds and RMS-normalizes.
  int4_gemv    the same for int4 group-128 weights (symmetric or with zero points), row-major or (the
               engine's) tile_int4's layout; its reference is int_linear.reference. int4_gemv_group likewise.
Both launch as programmatic dependents (PDL; NINFER_PDL=0 turns it off): each block streams its first
weight tiles while the kernel before it finishes. NINFER_GEMV_PIPELINE picks how the tiled NVFP4 GEMV
streams its weights (PIPELINES).
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("ops.cpp", "quant_gemv_sm90.cu")
HEADERS = ("quant_gemv_sm90.h",)
CUDA_FLAGS = ["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-lineinfo"]
TILE_K = 128  # K per warp tile of the GEMVs
GEMV_SHAPES = {(w, d) for w in (4, 8, 16) for d in (2, 4)}  # (warps per block, tiles in flight per warp)
BULK_SHAPES = {(4, 4), (4, 8), (8, 2), (8, 4), (8, 8)}  # the bulk pipeline's (consumer warps = tiles per slot, slots)
STAGED_BULK_SHAPES = {(4, 8), (8, 4)}  # bulk_shape's: bulk-block-columns' with a staged norm or glu (csrc)


def _build_dir() -> Path:
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update((CSRC / name).read_bytes())
    digest.update(" ".join(CUDA_FLAGS).encode())
    root = Path(os.environ.get("NINFER_CACHE", Path.home() / ".cache" / "ninfer"))
    path = root / "torch_ext" / f"torch{torch.__version__}-cu{torch.version.cuda}-{digest.hexdigest()[:16]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def available() -> bool:
    """True once the extension is loaded (torch.ops.ninfer.*); False where it cannot run here."""
    if os.environ.get("NINFER_CUDA_KERNELS", "1") == "0" or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability() != (9, 0):
        return False  # sm_90a code (Hopper); the RTX 5090's kernels are csrc/nvfp4_mma_sm120a.cu
    from torch.utils.cpp_extension import load

    try:
        load(name="ninfer_cuda_ops", sources=[str(CSRC / s) for s in SOURCES], extra_cuda_cflags=CUDA_FLAGS,
             extra_cflags=["-O3"], build_directory=str(_build_dir()), is_python_module=False)
    except Exception as err:  # noqa: BLE001 - any build failure leaves the Triton kernels in charge
        warnings.warn(f"CUDA kernels not built ({err}); using the Triton kernels", stacklevel=2)
        return False
    return True


def gemv_fits(x: torch.Tensor, n: int) -> bool:
    """Whether the CUDA GEMVs take these rows: bf16, 1..16 of them, K % 128 == 0, N % 16 == 0."""
    m, k = x.shape
    return x.dtype == torch.bfloat16 and 1 <= m <= 16 and k % TILE_K == 0 and n % 16 == 0 and available()


def int4_gemv_fits(x: torch.Tensor, n: int, bits: int, group: int, scale: torch.Tensor) -> bool:
    """gemv_fits, for int4 weights in groups of 128 (one group per K tile) with bf16 scales."""
    return bits == 4 and group == TILE_K and scale.dtype == torch.bfloat16 and gemv_fits(x, n)


def gemv_shape(n: int, k: int, device: torch.device) -> tuple[int, int]:
    """(warps per block, tiles in flight per warp): one block per 16 rows; 8 warps split K, 16 where
    the blocks are too few to fill the GPU twice (K/V projections), at most one per K tile; two tiles
    in flight. The fastest (or within 10% of it) on qwen3.8-27b's shapes on the H200
    (tools/results/bench_gemv_h200.log)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    warps = 16 if n // 16 < 2 * sms else 8
    while warps > 4 and warps > k // TILE_K:
        warps //= 2
    return warps, 2


def tiles_nvfp4(n: int, k: int) -> bool:
    """Whether an N x K NVFP4 weight is kept in tile_nvfp4's layout here (the CUDA GEMV runs on this GPU)."""
    return n % 16 == 0 and k % TILE_K == 0 and available()


# Bit positions (m0, e0, e1, sign) of each element of a tiled code word (8 elements in K order, 32 bits).
# View v is elements 2v and 2v + 1, which the GEMV needs as a bf16 pair: (m0, e0, e1, sign) at bits
# (6, 7, 8, 15) of the low half and (22, 23, 24, 31) of the high half (fp4_view's mask, value * 2^-126).
# View 0's bits are there already (one AND); view 1's sit 4 bits lower (shift + AND), view 2's 10 bits
# lower, wrapping around the word (funnel rotate + AND), and view 3's m0 bits 6 lower, its other bits 14
# lower, wrapping (shift, rotate, two LOP3s): 9 instructions a word (the layout before: 1 + 2 + 4 + 4 = 11,
# plain shifts, with which no three views take one shift each). No four views tile the word's bits at one
# rotation each, and any split with fewer one-rotation views costs 10 or more, so 9 is the least
# (tests/kernels/test_quant_gemv_emulation.py searches every three-plus-one choice).
# A view's two elements are consecutive in K, as x's bf16 pairs are.
VIEW_TARGET = ((6, 7, 8, 15), (22, 23, 24, 31))  # (low, high half): where fp4_view leaves an element's bits
VIEW_SHIFTS = ((0, 0, 0, 0), (4, 4, 4, 4), (10, 10, 10, 10), (6, 14, 14, 14))  # left rotations, per (m0, e0, e1, sign)
ELEMENT_BITS = tuple(tuple((VIEW_TARGET[element % 2][bit] - VIEW_SHIFTS[element // 2][bit]) % 32 for bit in range(4))
                     for element in range(8))


def _signless_scales(qweight: torch.Tensor, block_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same values with every block scale >= 0 and a zero scale's codes zero: a negative scale's
    codes change sign instead (E2M1's sign bit, 0x88 per byte), so the GEMV decodes a scale with no sign
    or zero case (csrc scales_tiled)."""
    s = block_scale.view(torch.uint8)
    magnitude = s & 0x7F
    zero = (magnitude == 0).repeat_interleave(8, dim=1)  # 16 codes (8 bytes) per scale
    negative = ((s & 0x80) != 0).repeat_interleave(8, dim=1)
    codes = torch.where(zero, 0, torch.where(negative, qweight ^ 0x88, qweight))
    return codes, magnitude


def encode_views(qweight: torch.Tensor) -> torch.Tensor:
    """u8 codes [N, K/2] (element 2i in byte i's low nibble) -> the same shape with each 32-bit word's
    eight elements' bits moved to ELEMENT_BITS."""
    words = qweight.contiguous().view(torch.int32).long() & 0xFFFFFFFF
    out = torch.zeros_like(words)
    for element, positions in enumerate(ELEMENT_BITS):
        for bit, position in enumerate(positions):
            out |= ((words >> (4 * element + bit)) & 1) << position
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32).view(torch.uint8).view(qweight.shape)


def tile_nvfp4(qweight: torch.Tensor, block_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 codes u8 [N, K/2] and scales [N, K/16] -> the GEMV's tiled layout (done once, at load):
    scales made non-negative (_signless_scales), each code word's bits at ELEMENT_BITS, and each
    (16 rows, 128 K) tile's 1 KB of codes and 128 B of scales contiguous, in the order its warp's lanes
    load them (lane 4g + c: rows g then g + 8 of the codes, 16 B each; rows g and g + 8's two scale bytes)."""
    n, t = qweight.shape[0], qweight.shape[1] // 64
    codes, scales = _signless_scales(qweight, block_scale)
    codes = encode_views(codes).view(n // 16, 2, 8, t, 4, 16).permute(0, 3, 1, 2, 4, 5).contiguous().view(n // 16, t, 1024)
    scales = scales.view(n // 16, 2, 8, t, 4, 2).permute(0, 3, 2, 4, 1, 5).contiguous()
    return codes, scales.view(n // 16, t, 128)


def tiles_int4(n: int, k: int, bits: int, group: int, scale: torch.Tensor) -> bool:
    """Whether an N x K int weight is kept in tile_int4's layout here: 4 bits in groups of 128 with bf16
    scales (what the CUDA GEMV reads), N % 16 == 0, on a GPU where it runs."""
    return bits == 4 and group == TILE_K and scale.dtype == torch.bfloat16 and tiles_nvfp4(n, k)


def tile_int4(qweight: torch.Tensor, scale: torch.Tensor,
              zero_point: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """int4-g128 codes i32 [N, K/8], bf16 scales [N, K/128], zero points (None: symmetric) i32 [N/8, K/128]
    -> (codes i32 [N/16, K/128, 256], records u8 [N/16, K/128, 40]): each (16 rows, 128 K) tile's 1 KB of
    codes contiguous in the order its warp's lanes load it (lane 4g + c: 16 B of row g, then at 512 B 16 B
    of row g + 8, K values 128 kt + 32 c ..), as tile_nvfp4 lays NVFP4 codes, the words unchanged (the int4
    codec's nibble pairs); and the tile's group scales and zero points in one record, where lane 4g + c
    finds its two rows' both in two loads (csrc Int4Tiled): word g (bytes 4g ..) = the scales of rows g
    (low half) and g + 8 (high half), byte 32 + g = their offset-binary zero points (row g in the low
    nibble; 8 when symmetric). The records are 40 B a tile where the row-major parts are 32 (symmetric) or 40."""
    n, t = qweight.shape[0], qweight.shape[1] // 16
    codes = qweight.view(n // 16, 2, 8, t, 4, 4).permute(0, 3, 1, 2, 4, 5).contiguous().view(n // 16, t, 256)
    scales = scale.view(torch.int16).view(n // 16, 2, 8, t).permute(0, 3, 2, 1).contiguous()  # [.., t, g, row half]
    if zero_point is None:
        v = torch.full((n, t), 8, dtype=torch.int32, device=qweight.device)
    else:
        shifts = 4 * torch.arange(8, device=qweight.device, dtype=torch.int32)
        v = ((zero_point[:, None, :] >> shifts[None, :, None]) & 15).reshape(n, t)  # row 8 r + j: word r's nibble j
    v = v.view(n // 16, 2, 8, t)
    zeros = (v[:, 0] | (v[:, 1] << 4)).permute(0, 2, 1).to(torch.uint8)  # [.., t, g]
    return codes, torch.cat([scales.view(n // 16, t, 16).view(torch.uint8), zeros], dim=2)


PDL = os.environ.get("NINFER_PDL", "1") != "0"  # GEMVs as programmatic dependent launches (csrc)
# How the NVFP4 GEMV streams the tiled layout's weights (csrc Pipeline): "ring" (each warp keeps its next
# tiles in registers), "ring-staged-x" (the ring, x copied to shared memory first where it fits in 48 KB
# with the partial sums, else the plain ring), "bulk" (a producer warp streams each block's rows through
# shared memory with bulk asynchronous copies; gate, up and SiLU-mul can share its launch),
# "ring-block-columns" (at M = 1 the staged ring with each NVFP4 block an MMA column, so the block scales
# multiply fp32 sums, 4 a tile, not the codes, 32, and a persistent grid that stages x once a block:
# csrc Nvfp4Columns; other rows as ring-staged-x), "bulk-block-columns" (at M = 1 the bulk pipeline's
# streaming with Nvfp4Columns' arithmetic, a persistent grid, x staged once a block; other rows as bulk; with the
# layer norm staged and glu, 58.2 against ring-block-columns' 61.2 us an MLP block in stop 27's chain, H100),
# or "auto": AUTO_ONE_ROW at one row, ring-staged-x at more. One row ran ring-block-columns from stop 21 (H200:
# C = 1 147.4 vs ring-staged-x's 140.9 tok/s) to stop 27 (bulk-block-columns + glu +4-5% on the H100, gpu_notes);
# ring-staged-x had beaten bulk + GLU at C = 1 by 2-3% and the ring at C = 2 and 4 by 3% (stop 18).
# The row-major layout has the ring only.
PIPELINES = {"ring": 0, "ring-staged-x": 1, "bulk": 2, "ring-block-columns": 3, "bulk-block-columns": 4}
PIPELINE_NAMES = (*PIPELINES, "auto")
PIPELINE = os.environ.get("NINFER_GEMV_PIPELINE", "auto")
if PIPELINE not in PIPELINE_NAMES:
    raise ValueError(f"NINFER_GEMV_PIPELINE={PIPELINE!r}: one of {PIPELINE_NAMES}")


GLU_PIPELINES = ("bulk", "bulk-block-columns")  # those that can write SiLU(gate) * up themselves (glu)
NORM_PIPELINES = ("ring-block-columns", "bulk-block-columns")  # those that can stage a layer norm (one row)
# Whether gate and up's launch writes SiLU(gate) * up itself where its pipeline can (GLU_PIPELINES),
# so no SiLU-mul kernel runs between it and down's GEMV. Read at each call: tools/bench.py --ab-fused-glu flips
# it. On since stop 27 (H100, adjacent arms at C = 1: bulk-block-columns with glu 129.9/126.4 against auto's
# then ring-block-columns 125.1/119.7 tok/s). A glu launch for ring-block-columns (each strip's gate rows, then
# up's) was built in stop 26 and dropped in stop 27: 123.6/121.2 tok/s against 126.2/120.5 without it, and 65.9
# against 61.2 us an MLP block in the chain.
FUSED_GLU = os.environ.get("NINFER_FUSED_GLU", "1") != "0"


def uses_glu(rows: int, mlp: bool = True) -> bool:
    """Whether the engine's SwiGLU launches of `rows` rows write SiLU(gate) * up themselves now (FUSED_GLU)."""
    return FUSED_GLU and pipeline_for(rows=rows, mlp=mlp) in GLU_PIPELINES


AUTO_ONE_ROW = "bulk-block-columns"  # what "auto" runs at one row (more rows: ring-staged-x); stop 27, see FUSED_GLU
# The pipeline of the MLP's launches (QuantizedLinear.mlp: gate and up, down), "" for PIPELINE's. Apart because
# they alone follow and precede GEMVs only (the norm staged, glu): a persistent grid's start and end hide behind
# them under PDL, not behind a Triton kernel (gpu_notes stop 25). Read at each call (bench --ab-mlp-pipeline).
MLP_PIPELINE = os.environ.get("NINFER_MLP_PIPELINE", "")
if MLP_PIPELINE not in ("", *PIPELINE_NAMES):
    raise ValueError(f"NINFER_MLP_PIPELINE={MLP_PIPELINE!r}: empty or one of {PIPELINE_NAMES}")


def pipeline_for(pipeline: str | None = None, rows: int = 1, mlp: bool = False) -> str:
    """The pipeline a tiled NVFP4 GEMV of `rows` rows runs: `pipeline`, else PIPELINE as it is now (MLP_PIPELINE
    for an MLP's weights where set; tools/bench.py --ab-pipeline changes them), "auto" resolved: AUTO_ONE_ROW
    at one row, ring-staged-x at more."""
    if pipeline is None:
        pipeline = MLP_PIPELINE if mlp and MLP_PIPELINE else PIPELINE
    if pipeline != "auto":
        return pipeline
    return AUTO_ONE_ROW if rows == 1 else "ring-staged-x"


def bulk_shape(k: int) -> tuple[int, int]:
    """The bulk pipeline's (consumer warps, slots): 8 warps (a slot = 8 K tiles, 9 KB) and 4 slots, 4 warps
    and 8 slots where K has fewer than 8 tiles."""
    return (8, 4) if k // TILE_K >= 8 else (4, 8)


def nvfp4_shape(pipeline: str, n: int, k: int, device: torch.device) -> tuple[int, int]:
    """The shape a resolved pipeline launches an N x K (total) NVFP4 GEMV with by default."""
    return bulk_shape(k) if pipeline in ("bulk", "bulk-block-columns") else gemv_shape(n, k, device)


def nvfp4_gemv(x: torch.Tensor, qweight, block_scale, global_scale, shape: tuple[int, int] | None = None,
               tiled_n: int | None = None, pipeline: str | None = None) -> torch.Tensor:
    """x [M <= 16, K] bf16 -> y [M, N] bf16: nvfp4_linear.reference's float32 sums, rounded once.
    `shape`: the pipeline's (gemv_shape, bulk_shape). `tiled_n`: qweight, block_scale are tile_nvfp4's
    layout of an N = tiled_n weight. `pipeline`: see nvfp4_gemv_group."""
    return nvfp4_gemv_group(x, [(qweight, block_scale, global_scale)], shape, tiled=tiled_n is not None,
                            pipeline=pipeline)[0]


def nvfp4_gemv_group(x: torch.Tensor, weights: list[tuple], shape: tuple[int, int] | None = None,
                     tiled: bool = False, pdl: bool = PDL, pipeline: str | None = None,
                     glu: bool = False) -> list[torch.Tensor]:
    """nvfp4_gemv of 1 to 3 weights (qweight, block_scale, global_scale) that read the same x, as one
    launch -> each one's y [M, N]. `tiled`: all in tile_nvfp4's layout. `pipeline`: one of PIPELINES
    (tiled only), None: PIPELINE as it is at the call (tools/bench.py --ab-pipeline flips it for a second
    set of decode figures). `shape`: the pipeline's, as for their total N (gemv_shape, bulk_shape).
    `glu` (tiled, the bulk pipelines): the weights are gate and up of one N -> [SiLU(x @ gate^T) *
    (x @ up^T)], from the float32 sums, rounded once (the SwiGLU MLP's activation with no kernel of its own)."""
    pipeline = pipeline_for(pipeline, x.shape[0]) if tiled else "ring"
    if glu and (pipeline not in GLU_PIPELINES or len(weights) != 2):
        raise ValueError(f"glu: gate and up in the bulk pipeline (tiled), not {len(weights)} weights in {pipeline!r}")
    rows = [q.shape[0] * (16 if tiled else 1) for q, _, _ in weights]
    ys = _outputs(x, rows[:1] if glu else rows)
    shape = shape or nvfp4_shape(pipeline, sum(rows), x.shape[1], x.device)
    _raise_refusal(torch.ops.ninfer.nvfp4_gemv(x.contiguous(), *_nvfp4_operands(weights, x.device), ys, *shape, tiled,
                                               pdl, PIPELINES[pipeline], glu))
    return ys


def _nvfp4_operands(weights: list[tuple], device: torch.device) -> tuple[list, list, list]:
    """(qweight, block_scale, global_scale) triples -> the ops' q, scale (as bytes) and s2 (one float32 each) lists."""
    return ([q for q, _, _ in weights], [s.view(torch.uint8) for _, s, _ in weights],
            [g.reshape(1).to(device=device, dtype=torch.float32) for _, _, g in weights])


# Whether a one-row layer norm is staged by the GEMV after it (nvfp4_norm_gemv_group; NINFER_FUSED_NORM=0:
# a norm kernel, then the GEMV). Read at each call: tools/bench.py --ab-fused-norm flips it. (The GDN
# output norm and SwiGLU's SiLU-mul were staged so too, and lost on the H200: C = 1 145.6 and 133.9 tok/s
# against 149.2 with neither; gpu_notes stop 24.)
FUSED_NORM = os.environ.get("NINFER_FUSED_NORM", "1") != "0"


def norm_gemv_fits(x: torch.Tensor, weights: list[tuple], norm_weight: torch.Tensor, glu: bool = False,
                   pipeline: str | None = None) -> bool:
    """Whether nvfp4_norm_gemv_group takes this: FUSED_NORM, one bf16 row of K % 128 == 0 and a bf16 norm
    weight of K, tiled NVFP4 weights in `pipeline` (pipeline_for's) of NORM_PIPELINES (`glu`: bulk-block-columns,
    two of one N), and what a block stages within its shared memory: ring-block-columns x (and the zeros after
    it), the partial and the warps' sums in the 48 KB a block gets (csrc launch_persistent); bulk-block-columns
    the slots too, in the 227 KB a Hopper block can opt in to (csrc launch_bulk_columns)."""
    m, k = x.shape
    rows = [q.shape[0] * 16 for q, _, _ in weights]
    pipeline = pipeline_for(pipeline)
    if not (FUSED_NORM and m == 1 and norm_weight.dtype == torch.bfloat16 and norm_weight.numel() == k
            and pipeline in NORM_PIPELINES and gemv_fits(x, sum(rows))):
        return False
    if glu and (pipeline not in GLU_PIPELINES or len(rows) != 2 or rows[0] != rows[1]):
        return False
    warps, depth = nvfp4_shape(pipeline, sum(rows), k, x.device)
    if pipeline == "bulk-block-columns":
        return _persistent_bulk_fits(warps, depth, 128, 2 * k + 64, glu)
    return 2 * k + 64 + 516 * warps <= 48 * 1024


def _persistent_bulk_fits(warps: int, depth: int, side_bytes: int, x_bytes: int, glu: bool) -> bool:
    """Whether a persistent bulk block's slots (depth x warps tiles of 1 KB of codes and side_bytes of scales
    or records), its staged x, partial sums (glu: gate's and up's) and warp sums fit the 227 KB a Hopper block
    can opt in to (csrc launch_persistent_bulk)."""
    partial_bytes = 512 * warps * (2 if glu else 1)
    return depth * warps * (1024 + side_bytes) + x_bytes + partial_bytes + 4 * warps + 128 <= 227 * 1024


def _norm_outputs(x: torch.Tensor, residual: torch.Tensor | None, normed: bool, rows: list[int],
                  glu: bool) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """A one-row norm launch's outputs: the sum (x itself with no residual), the normed row where asked, and
    each weight's y (glu: one)."""
    s = torch.empty_like(x) if residual is not None else x
    return s, torch.empty_like(x) if normed else None, _outputs(x, rows[:1] if glu else rows)


def nvfp4_norm_gemv_group(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                          offset: float, weights: list[tuple], normed: bool = False, shape: tuple[int, int] | None = None,
                          pdl: bool = PDL, pipeline: str | None = None,
                          glu: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """One row x [1, K]: (s = x + residual (x itself with no residual), RMSNorm(s) if `normed` else None,
    [RMSNorm(s) @ W^T for W in weights]) in one launch of tiled NVFP4 weights in a block-columns pipeline
    (`pipeline`, as nvfp4_gemv_group's; NORM_PIPELINES): each block stages the normed row itself, as
    layers.add_rms_norm rounds it (the sum exactly; the norm to float32 rounding: its sum of squares may
    associate differently). `glu` (bulk-block-columns): gate and up -> [SiLU(normed @ gate^T) * (normed @ up^T)]."""
    pipeline = pipeline_for(pipeline)
    if pipeline not in NORM_PIPELINES or (glu and (pipeline not in GLU_PIPELINES or len(weights) != 2)):
        raise ValueError(f"a staged norm in {NORM_PIPELINES} (glu: gate and up in bulk-block-columns), "
                         f"not {len(weights)} weights in {pipeline!r}")
    rows = [q.shape[0] * 16 for q, _, _ in weights]
    s, y, ys = _norm_outputs(x, residual, normed, rows, glu)
    shape = shape or nvfp4_shape(pipeline, sum(rows), x.shape[1], x.device)
    _raise_refusal(torch.ops.ninfer.nvfp4_norm_gemv(
        x.contiguous(), residual.contiguous() if residual is not None else None, norm_weight.contiguous(),
        s if residual is not None else None, y, float(eps), float(offset), *_nvfp4_operands(weights, x.device), ys,
        *shape, pdl, PIPELINES[pipeline], glu))
    return s, y, ys


def int4_gemv(x: torch.Tensor, qweight, scale, zero_point, shape: tuple[int, int] | None = None) -> torch.Tensor:
    """x [M <= 16, K] bf16 -> y [M, N] bf16: int_linear.reference's (4 bits, group 128) float32 sums,
    rounded once. `shape`: (warps, depth), see gemv_shape."""
    return int4_gemv_group(x, [(qweight, scale, zero_point)], shape)[0]


# How the tiled int4 GEMVs stream their weights: "ring-staged-x" (each warp's next tiles in registers, x
# staged), "bulk" (NVFP4's bulk pipeline with int4's arithmetic, where K % 256 == 0: a tile's 40-byte
# record then lands 16-byte aligned; gate, up and SiLU-mul can share its launch) or "bulk-staged-x" (at one
# row the bulk pipeline with a persistent grid that stages x once a block, csrc gemv_bulk_persistent; more rows
# as bulk). Read at each call (tools/bench.py --ab-int4-pipeline). Bulk since stop 44 (one H100, adjacent:
# the 27B's int4 C = 1 120.9 -> 136.1 tok/s, C = 8 831.3 -> 834.3); bulk-staged-x is GPU-unmeasured.
INT4_PIPELINE = os.environ.get("NINFER_INT4_PIPELINE", "bulk")
INT4_PIPELINES = ("ring", "ring-staged-x", "bulk", "bulk-staged-x")
INT4_BULK = ("bulk", "bulk-staged-x")  # those that need K % 256 == 0 and can write SiLU(gate) * up (glu)
PIPELINE_IDS = {**PIPELINES, "bulk-staged-x": 5}  # csrc Pipeline (bulk-staged-x: tiled int4's alone)
if INT4_PIPELINE not in INT4_PIPELINES:
    raise ValueError(f"NINFER_INT4_PIPELINE={INT4_PIPELINE!r}: one of {INT4_PIPELINES}")


def int4_pipeline_for(k: int) -> str:
    """The pipeline a tiled int4 GEMV of K runs by default: INT4_PIPELINE as it is now, the staged ring
    where the bulk pipeline cannot take K."""
    return INT4_PIPELINE if INT4_PIPELINE not in INT4_BULK or k % 256 == 0 else "ring-staged-x"


def int4_uses_glu(k: int) -> bool:
    """Whether the engine's tiled int4 SwiGLU launch of K writes SiLU(gate) * up itself (FUSED_GLU, bulk)."""
    return FUSED_GLU and int4_pipeline_for(k) in INT4_BULK


def int4_gemv_group(x: torch.Tensor, weights: list[tuple], shape: tuple[int, int] | None = None,
                    pdl: bool = PDL, tiled: bool = False, pipeline: str | None = None,
                    glu: bool = False) -> list[torch.Tensor]:
    """int4_gemv of 1 to 3 weights (qweight, scale, zero_point) that read the same x, as one launch.
    `tiled`: every weight tile_int4's (codes, records, None), streamed by `pipeline` (INT4_PIPELINES;
    None: int4_pipeline_for's); the row-major codes take the ring. `glu` (tiled, INT4_BULK): the weights
    are gate and up of one N -> [SiLU(x @ gate^T) * (x @ up^T)], as nvfp4_gemv_group's."""
    rows = [q.shape[0] * (16 if tiled else 1) for q, _, _ in weights]
    pipeline = pipeline or (int4_pipeline_for(x.shape[1]) if tiled else "ring")
    if glu and (pipeline not in INT4_BULK or len(weights) != 2):
        raise ValueError(f"glu: gate and up in the bulk pipeline (tiled), not {len(weights)} weights in {pipeline!r}")
    ys = _outputs(x, rows[:1] if glu else rows)
    warps, depth = shape or (bulk_shape(x.shape[1]) if pipeline in INT4_BULK else gemv_shape(sum(rows), x.shape[1], x.device))
    _raise_refusal(torch.ops.ninfer.int4_gemv(x.contiguous(), [q for q, _, _ in weights], [s for _, s, _ in weights],
                                              [z for _, _, z in weights], ys, warps, depth, tiled, pdl,
                                              PIPELINE_IDS[pipeline], glu))
    return ys


def int4_norm_gemv_fits(x: torch.Tensor, rows: list[int], norm_weight: torch.Tensor, glu: bool = False) -> bool:
    """Whether int4_norm_gemv_group takes this: FUSED_NORM, tiled int4 weights of `rows` (their N) whose one
    bf16 row of K runs bulk-staged-x (int4_pipeline_for; glu: two of one N), a bf16 norm weight of K, and the
    slots, x, the partials and the warps' sums within the 227 KB a Hopper block can opt in to."""
    m, k = x.shape
    if not (FUSED_NORM and m == 1 and norm_weight.dtype == torch.bfloat16 and norm_weight.numel() == k
            and int4_pipeline_for(k) == "bulk-staged-x" and gemv_fits(x, sum(rows))):
        return False
    if glu and (len(rows) != 2 or rows[0] != rows[1]):
        return False
    return _persistent_bulk_fits(*bulk_shape(k), 40, 2 * k, glu)


def int4_norm_gemv_group(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                         offset: float, weights: list[tuple], normed: bool = False, shape: tuple[int, int] | None = None,
                         pdl: bool = PDL, glu: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """nvfp4_norm_gemv_group for tiled int4 weights (tile_int4's (codes, records, None)) in bulk-staged-x:
    one row x [1, K] -> (x + residual, RMSNorm of it if `normed`, [RMSNorm @ W^T for W in weights]) in one
    launch whose blocks stage the normed row themselves; `glu`: gate and up -> [SiLU(gate) * up]."""
    if glu and len(weights) != 2:
        raise ValueError(f"glu: gate and up, not {len(weights)} weights")
    s, y, ys = _norm_outputs(x, residual, normed, [q.shape[0] * 16 for q, _, _ in weights], glu)
    shape = shape or bulk_shape(x.shape[1])
    _raise_refusal(torch.ops.ninfer.int4_norm_gemv(
        x.contiguous(), residual.contiguous() if residual is not None else None, norm_weight.contiguous(),
        s if residual is not None else None, y, float(eps), float(offset), [q for q, _, _ in weights],
        [r for _, r, _ in weights], ys, *shape, pdl, PIPELINE_IDS["bulk-staged-x"], glu))
    return s, y, ys


def _raise_refusal(message: str) -> None:
    """The ops return why they refused or failed instead of raising in C++ (csrc/ops.cpp: guarded)."""
    if message:
        raise RuntimeError(message)


def _outputs(x: torch.Tensor, rows: list[int]) -> list[torch.Tensor]:
    return [torch.empty(x.shape[0], n, dtype=torch.bfloat16, device=x.device) for n in rows]
