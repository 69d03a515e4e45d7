"""The memory plan: what a serving configuration holds, whether it fits, and what would fit.

One accounting serves `ninfer-run plan` and the server's start-up check, which refuses (printing the
plan) a configuration that does not fit. On the device:
  - weights: the artifact's tensor bytes (the GPU path reads them as stored; the CPU reference path
    holds them dequantized to fp32);
  - the KV pool: exactly --max-context tokens of INT8 group-64 (or bf16) K and V for the
    full-attention layers only, plus the MTP layer's own pool with speculative decoding;
  - Gated DeltaNet state (fp32 recurrent + bf16 conv history) per running sequence, and per
    speculative rollback slot (draft tokens + 1 per sequence);
  - media buffers with --vision (encoder cache + live images);
  - activation workspace for one prefill chunk, logits, CUDA-graph pools and the runtime's own
    overhead — estimates, named as such in the table.
Prefix-cache frontiers keep their KV blocks inside the pool; their GDN snapshots live in host memory
on the GPU path (counted apart), in the same memory on the CPU path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from math import prod

from .engine import EngineConfig
from .kernels.prefill_modes import SPLIT_ROWS
from .kv.pool import READ_SLICE
from .kv.quant import GROUP
from .vision.encoder import PREFIX as VISION_PREFIX

MiB, GiB = 2**20, 2**30
RUNTIME_OVERHEAD = 512 * MiB  # estimate: CUDA context, library handles, allocator rounding
CUDA_GRAPH_POOL = 256 * MiB  # estimate: decode graphs for every batch-size bucket share one pool
GDN_CHUNK = 64  # chunked GDN prefill keeps one [Dk, Dv] state per head per chunk
DEFAULT_MEDIA_CACHE_MIB, DEFAULT_MEDIA_LIVE_MIB = 1024, 2048  # as the seed engine's defaults


@dataclass(frozen=True)
class ModelShape:
    """The dimensions memory depends on, read from the artifact's config and registry entry."""

    attention_layers: int
    gdn_layers: int
    kv_heads: int
    head_dim: int
    q_heads: int
    hidden: int
    intermediate: int
    vocab: int
    max_positions: int = 0  # the model's context limit (max_position_embeddings); 0 = unknown
    gdn_k_heads: int = 0
    gdn_v_heads: int = 0
    gdn_k_dim: int = 0
    gdn_v_dim: int = 0
    conv_kernel: int = 0

    @classmethod
    def from_config(cls, family: str, config: dict, entry: dict) -> ModelShape:
        if family == "qwen3_5_hybrid":
            t = config["text_config"]
            pattern = entry["layer_pattern"]
            kinds = [pattern[i % len(pattern)] for i in range(t["num_hidden_layers"])]
            return cls(attention_layers=kinds.count("full_attention"), gdn_layers=kinds.count("linear_attention"),
                       kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"], q_heads=t["num_attention_heads"],
                       hidden=t["hidden_size"], intermediate=t["intermediate_size"], vocab=t["vocab_size"],
                       max_positions=t.get("max_position_embeddings", 0), gdn_k_heads=t["linear_num_key_heads"], gdn_v_heads=t["linear_num_value_heads"],
                       gdn_k_dim=t["linear_key_head_dim"], gdn_v_dim=t["linear_value_head_dim"],
                       conv_kernel=t["linear_conv_kernel_dim"])
        if family == "qwen3_dense":
            return cls(attention_layers=config["num_hidden_layers"], gdn_layers=0,
                       kv_heads=config["num_key_value_heads"], head_dim=config["head_dim"],
                       q_heads=config["num_attention_heads"], hidden=config["hidden_size"],
                       intermediate=config["intermediate_size"], vocab=config["vocab_size"],
                       max_positions=config.get("max_position_embeddings", 0))
        raise ValueError(f"no memory model for family {family!r}")

    @property
    def gdn_state_bytes(self) -> int:
        """One sequence: recurrent state fp32 [Hv, Dk, Dv] + conv history bf16 [K-1, channels], all GDN layers."""
        channels = 2 * self.gdn_k_heads * self.gdn_k_dim + self.gdn_v_heads * self.gdn_v_dim
        per_layer = self.gdn_v_heads * self.gdn_k_dim * self.gdn_v_dim * 4 + (self.conv_kernel - 1) * channels * 2
        return self.gdn_layers * per_layer if self.gdn_layers else 0

    def kv_bytes_per_token(self, kv_dtype: str, mtp: bool = False) -> int:
        values = 2 * (self.attention_layers + (1 if mtp else 0)) * self.kv_heads * self.head_dim
        return values + values // GROUP * 2 if kv_dtype == "int8" else values * 2

    def prefill_scratch_bytes(self, max_context: int, gpu: bool) -> int:
        """Transient buffers of one long prefill chunk beyond its activations. GPU: one KV head's keys
        and values at the full context in bf16 plus the decode slices' float32 temporaries (the
        dense attention path, kernels/paged_attention.py), and the bf16 dequantization buffer of the
        largest linear (the MLP's). CPU reference path: one layer's whole K/V read back in float32."""
        fixed = 3 * READ_SLICE * self.head_dim * 4 + self.intermediate * self.hidden * 2 if gpu else 0
        return max_context * self.scratch_per_token(gpu) + fixed

    def scratch_per_token(self, gpu: bool) -> int:
        return 2 * self.head_dim * 2 if gpu else 2 * self.kv_heads * self.head_dim * 4

    def workspace_bytes(self, prefill_chunk: int, rows: int, split_attention: bool = False) -> int:
        """Estimate of the activations of one prefill chunk (bf16) plus fp32 logits for `rows` tokens.
        `split_attention`: long chunks attend split (kernels/paged_attention.py), which holds ~4 more
        bf16 rows of one KV head's query group at once (its own keys and values or the folded queries, the
        two outputs; the merge writes into the chunk's output) for each of at most SPLIT_ROWS rows."""
        gdn = 2 * self.gdn_k_heads * self.gdn_k_dim + 2 * self.gdn_v_heads * self.gdn_v_dim if self.gdn_layers else 0
        per_token = 4 * self.hidden + 3 * self.intermediate + 2 * gdn + 2 * 2 * self.q_heads * self.head_dim
        split = 0
        if split_attention:  # per piece of at most SPLIT_ROWS of the chunk's rows
            split = min(prefill_chunk, SPLIT_ROWS) * 4 * (self.q_heads // max(self.kv_heads, 1)) * self.head_dim
        chunk_states = -(-prefill_chunk // GDN_CHUNK) * self.gdn_v_heads * self.gdn_k_dim * self.gdn_v_dim * 4
        return (prefill_chunk * per_token + split) * 2 + chunk_states + 2 * rows * self.vocab * 4


@dataclass(frozen=True)
class MemoryPlan:
    config: EngineConfig
    device: str  # "cuda": frontier snapshots in host memory; "cpu": one memory for everything
    weights: int
    kv_per_token: int
    kv_pool: int
    sequence_state: int
    running_states: int  # with decode graphs they live in their slab (graphs.py): still C states
    rollback_states: int
    frontier_states: int
    media: int
    workspace: int
    prefill_scratch: int
    cuda_graphs: int
    runtime: int

    @property
    def device_total(self) -> int:
        on_device = (self.weights + self.kv_pool + self.running_states + self.rollback_states + self.media
                     + self.workspace + self.prefill_scratch + self.cuda_graphs + self.runtime)
        return on_device + (self.frontier_states if self.device == "cpu" else 0)

    @property
    def host_total(self) -> int:
        return self.frontier_states if self.device != "cpu" else 0

    def slack(self, capacity: int) -> int:
        return capacity - self.device_total

    def rows(self) -> list[tuple[str, int, str]]:
        c = self.config
        kv = f"{c.max_context:,} tokens x {self.kv_per_token:,} B ({c.kv_dtype}{', + MTP layer' if c.draft_tokens else ''})"
        rows = [("weights", self.weights, "artifact tensors" + (" (fp32 on the CPU path)" if self.device == "cpu" else "")),
                ("KV pool", self.kv_pool, kv),
                ("GDN state, running", self.running_states,
                 f"{c.max_concurrency} x {self.sequence_state / MiB:.1f} MiB"),
                ("GDN state, spec rollback", self.rollback_states,
                 f"{c.max_concurrency} x {c.draft_tokens + 1 if c.draft_tokens else 0} slots"),
                ("media buffers", self.media, "--vision: encoder cache + live images" if self.media else "no --vision"),
                ("activation workspace", self.workspace, f"estimate: prefill chunk {c.prefill_chunk} + logits"),
                ("prefill scratch", self.prefill_scratch,
                 "one KV head at full context + dequantized weight" if self.device != "cpu" else "one layer's K/V, fp32"),
                ("CUDA graphs", self.cuda_graphs, "estimate: one shared pool" if self.cuda_graphs else "none"),
                ("runtime overhead", self.runtime, "estimate: context, handles, allocator" if self.runtime else "none")]
        where = "same memory" if self.device == "cpu" else "host memory"
        rows.append(("frontier snapshots", self.frontier_states, f"{c.max_frontiers} x GDN state, {where}"))
        return rows


def artifact_weights(manifest, device: str, vision: bool) -> int:
    """Bytes the weights take where they live: as stored on the GPU path, fp32 on the CPU reference
    path; the vision tower only with --vision."""
    tensors = [t for t in manifest.tensors if vision or not t.name.startswith(VISION_PREFIX)]
    if device == "cpu":
        return sum(prod(t.logical_shape) * 4 for t in tensors)
    return sum(p.length for t in tensors for p in t.parts)


def artifact_plan(manifest, config: EngineConfig, device: str = "cuda", vision: bool = False,
                  **kw) -> tuple[ModelShape, int, MemoryPlan]:
    """(shape, weights, plan) for an opened artifact's manifest; `kw`: plan's media sizes and split_attention."""
    m = manifest.model
    shape = ModelShape.from_config(m["family"], manifest.config, m["registry_entry"])
    weights = artifact_weights(manifest, device, vision)
    return shape, weights, plan(shape, weights, config, device, vision, **kw)


def plan(shape: ModelShape, weights: int, config: EngineConfig, device: str = "cuda", vision: bool = False,
         media_cache_mib: int = DEFAULT_MEDIA_CACHE_MIB, media_live_mib: int = DEFAULT_MEDIA_LIVE_MIB,
         split_attention: bool = False) -> MemoryPlan:
    mtp = config.draft_tokens > 0
    per_token = shape.kv_bytes_per_token(config.kv_dtype, mtp)
    blocks = -(-config.max_context // config.block_size)
    state = shape.gdn_state_bytes
    gpu = device != "cpu"
    return MemoryPlan(
        config=config, device="cuda" if gpu else "cpu", weights=weights, kv_per_token=per_token,
        kv_pool=blocks * config.block_size * per_token, sequence_state=state,
        running_states=state * config.max_concurrency,
        rollback_states=state * (config.draft_tokens + 1) * config.max_concurrency if mtp else 0,
        frontier_states=state * config.max_frontiers,
        media=(media_cache_mib + media_live_mib) * MiB if vision else 0,
        workspace=shape.workspace_bytes(config.prefill_chunk, config.max_concurrency * (config.draft_tokens + 1),
                                        split_attention),
        prefill_scratch=shape.prefill_scratch_bytes(config.max_context, gpu),
        cuda_graphs=CUDA_GRAPH_POOL if gpu else 0, runtime=RUNTIME_OVERHEAD if gpu else 0)


def largest_context(shape: ModelShape, weights: int, config: EngineConfig, capacity: int, margin: int,
                    step: int = 4096, **kw) -> int:
    """The largest --max-context (a multiple of `step`, at most the model's own context) that fits in
    `capacity - margin`; 0 if none does."""
    fixed = plan(shape, weights, replace(config, max_context=0), **kw)
    room = capacity - margin - fixed.device_total
    fits = max(0, room // (fixed.kv_per_token + shape.scratch_per_token(fixed.device != "cpu")) // step * step)
    return min(fits, shape.max_positions) if shape.max_positions else fits


@dataclass(frozen=True)
class Advice:
    max_context: int
    max_concurrency: int
    reason: str


def recommend(shape: ModelShape, weights: int, config: EngineConfig, capacity: int, median_prompt: int | None,
              margin: int = 256 * MiB, **kw) -> Advice:
    """With a median prompt: the most concurrency whose prompts all stay resident (C x median <= pool)
    at the largest context that fits; without one: the largest context at the asked concurrency."""
    if not median_prompt:
        ctx = largest_context(shape, weights, config, capacity, margin, **kw)
        return Advice(ctx, config.max_concurrency, "the largest context that fits at this concurrency")
    best = None
    for c in range(1, 17):
        ctx = largest_context(shape, weights, replace(config, max_concurrency=c), capacity, margin, **kw)
        if ctx >= c * median_prompt and ctx > 0:
            best = Advice(ctx, c, f"{c} x median prompt {median_prompt:,} = {c * median_prompt:,} <= pool {ctx:,}")
    if best is None:
        ctx = largest_context(shape, weights, replace(config, max_concurrency=1), capacity, margin, **kw)
        return Advice(ctx, 1, f"even one median prompt ({median_prompt:,}) does not fit beside the weights"
                      if ctx < median_prompt else "one sequence")
    return best


def reuse_holds(config: EngineConfig, median_prompt: int) -> bool:
    """The seed's rule: prefix reuse survives only while C x median prompt <= the pool (--max-context)."""
    return config.max_concurrency * median_prompt <= config.max_context


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)?\s*$", re.I)
_UNITS = {None: 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def device_capacity(device: str) -> int:
    """Memory a server may plan with: free memory on a GPU, MemAvailable on the CPU path."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def parse_size(text: str) -> int:
    """'32GiB', '32 GB', '24000MiB', '1073741824' -> bytes."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (try 32GiB, 32GB or 24000MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower() if m.group(2) else None])


def format_plan(p: MemoryPlan, capacity: int, median_prompt: int | None = None) -> str:
    lines = [f"{'':26s}{'GiB':>9s}  what"]
    lines += [f"{name:26s}{value / GiB:9.2f}  {note}" for name, value, note in p.rows()]
    lines.append(f"{'total on the device':26s}{p.device_total / GiB:9.2f}")
    if p.host_total:
        lines.append(f"{'total in host memory':26s}{p.host_total / GiB:9.2f}")
    slack = p.slack(capacity)
    verdict = "fits" if slack >= 0 else "DOES NOT FIT"
    fixed = p.weights + p.workspace + p.cuda_graphs + p.runtime
    lines.append(f"{'capacity':26s}{capacity / GiB:9.2f}  {verdict}: slack {slack / GiB:+.2f} GiB; "
                 f"{(capacity - fixed) / GiB:.2f} GiB left for KV and state after weights and fixed overheads")
    if median_prompt:
        c = p.config
        rule = "holds" if reuse_holds(c, median_prompt) else "BROKEN: frontiers evict each other, reuse collapses"
        lines.append(f"prefix reuse: C x median prompt = {c.max_concurrency} x {median_prompt:,} = "
                     f"{c.max_concurrency * median_prompt:,} vs pool {c.max_context:,} tokens: {rule}")
    return "\n".join(lines)
