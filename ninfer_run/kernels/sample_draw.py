"""A sampled row's draw from its top-k candidates as one Triton kernel (a decode step's sampling on CUDA).

sampling.draw_sampled's torch path takes ~30 small launches after the vocabulary's top-k: the candidates
sorted into token order, a softmax, the k-th probability, top-p's sort, scan and scatter, the inverse CDF
and a gather - ~0.2 ms of a sampled step that a greedy one does not pay (H100, stop 43: a step 7.13 ms
against its graph's 6.88 at C = 1, greedy 6.93). Here one program per row holds its C <= MAX_CANDIDATES
candidates in registers and applies the same rules with pairwise sums in place of sorts:
  - p = softmax(logits / T) over the candidates; top-k keeps p >= the k-th largest p (ties kept);
  - top-p keeps a candidate while the mass before it, in descending p with ties in token order, is below
    top_p of the kept mass;
  - the token is the first, in token order, whose cumulative mass exceeds u times the total.
Its reference is sampling's torch path (tests/kernels/test_sample_draw.py draws both on fresh logits).
Its sums run in float32 where the torch path cumsums in float64 and sorts: a draw can differ only where u
falls within float32 rounding of a CDF boundary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_CANDIDATES = 256  # C = top_k + sampling.TOP_K_TIES; the pairwise sums hold C x C values in registers


@triton.jit
def _draw_kernel(values_ptr, index_ptr, u_ptr, out_ptr, C, top_k, inv_temperature, top_p,
                 TOP_P: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    ok = i < C
    v = tl.load(values_ptr + row * C + i, mask=ok, other=float("-inf"))  # top-k's order: descending
    token = tl.load(index_ptr + row * C + i, mask=ok, other=0)
    e = tl.where(ok, tl.exp((v - tl.max(v, 0)) * inv_temperature), 0.0)
    p = e / tl.sum(e, 0)
    kth = tl.sum(tl.where(i == top_k - 1, p, 0.0), 0)  # (descending values: the k-th is at k - 1)
    p = tl.where(p >= kth, p, 0.0)
    if TOP_P:
        ahead = (p[None, :] > p[:, None]) | ((p[None, :] == p[:, None]) & (token[None, :] < token[:, None]))
        before = tl.sum(tl.where(ahead, p[None, :], 0.0), 1)  # mass before each, descending p, ties by token
        p = tl.where(before < top_p * tl.sum(p, 0), p, 0.0)
    p = p / tl.sum(p, 0)
    cdf = tl.sum(tl.where(token[None, :] <= token[:, None], p[None, :], 0.0), 1)  # in token order
    u = tl.load(u_ptr + row).to(tl.float32)
    first = tl.min(tl.where(ok & (cdf > u * tl.sum(p, 0)), token, 2**62), 0)
    last = tl.max(tl.where(ok, token, -1), 0)  # (u * total rounded up past the last boundary)
    tl.store(out_ptr + row, tl.where(first == 2**62, last, first))


def fits(candidates: int) -> bool:
    return candidates <= MAX_CANDIDATES


def draw(values: torch.Tensor, index: torch.Tensor, u: torch.Tensor, temperature: float, top_k: int,
         top_p: float) -> torch.Tensor:
    """Rows of top-k candidates (values [n, C] float32 in descending order and their token ids [n, C],
    as torch.topk gives them; C = top_k + ties, <= MAX_CANDIDATES) and one uniform each [n] -> the token
    sampling.draw_sampled draws for that uniform [n] (int64)."""
    n, c = values.shape
    if not fits(c) or not 0 < top_k <= c:
        raise ValueError(f"draw takes 1 <= top_k <= C <= {MAX_CANDIDATES} candidates, got top_k {top_k} of {c}")
    out = torch.empty(n, dtype=torch.long, device=values.device)
    _draw_kernel[(n,)](values.contiguous(), index.contiguous(), u, out, c, top_k, 1.0 / temperature, top_p,
                       TOP_P=top_p < 1.0, BLOCK=max(triton.next_power_of_2(c), 16), num_warps=8)
    return out
