"""The reference engine: FIFO admission, continuous batching, chunked prefill, prefix reuse, stops.

One `step()` admits waiting requests (up to --max-concurrency, expiring those that waited longer
than --pending-timeout-ms), then advances every running sequence by one prefill chunk or one
decode token. Sequences in plain decode share one batched forward per step (the weights are read
once for all of them): `decode_batch`, or on CUDA a captured graph per batch size (graphs.py);
prefill chunks and speculative steps run per sequence (on CUDA their drafts and verify are graphed too).
Speculation runs while at most --spec-max-batch sequences decode: beyond that, drafting per sequence
costs more than it saves, so they join the plain batched step and their MTP heads catch up on the
skipped tokens in one forward when they speculate again.
Finished sequences leave a prefix-cache frontier. Cancellation frees a sequence's blocks at once.

Graphed plain steps (greedy or sampled) overlap the host with the device: a step's tokens stay on the device as
the next step's input, and the host reads them (stop checks, streaming, bookkeeping) while that next
step runs, so the GPU does not idle for the host between steps. A sequence that stops on a token the
host has not read yet has had one more step fed: its state holds its whole output, stop token
included, and the frontier it leaves says so.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .graphs import GraphedDecoder
from .kv.pool import BlockPool, KVLayout, PoolExhausted
from .kv.prefix import PrefixCache
from .sampling import SamplingParams, next_token, next_token_ids, next_tokens
from .spec import MTPDrafter, SpecStats, accept, keeping_steps
from .state import PagedKV, SequenceState
from .vision.media import MediaEncoder
from .vision.prompt import MultimodalPrompt

log = logging.getLogger("ninfer.engine")


class RequestRejected(ValueError):
    """The request can never run (prompt over the context, empty prompt)."""


class QueueFull(RuntimeError):
    """The admission queue already holds --max-queued-requests requests: try again later."""


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int = 256
    params: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: tuple[int, ...] = ()
    stop: Callable[[list[int]], bool] | None = None  # e.g. stop strings, checked on the decoded tail
    id: str = ""
    on_update: Callable[[Result], None] | None = None  # called (engine thread) at admission, after new tokens, at the end
    # prompt positions to keep a prefix-cache frontier at (e.g. where the chat template's generation
    # prompt starts: the next turn re-renders the reply differently but shares everything before it)
    snapshot_at: tuple[int, ...] = ()
    mm: MultimodalPrompt | None = None  # images in the prompt (encoded when the request is admitted)
    cache_key: list[int] | None = None  # the prompt as the prefix cache sees it (images by content)

    @property
    def key(self) -> list[int]:
        return self.cache_key if self.cache_key is not None else self.prompt


@dataclass
class Result:
    id: str
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "expired" (never admitted) | "error"
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    submitted: float = 0.0
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def log_line(self) -> str:
        """Like the seed engine's: prompt, reuse, TTFT, prefill and decode speeds, output length."""
        ttft = (self.first_token or self.finished or 0) - self.submitted
        prefill_s = (self.first_token or 0) - (self.admitted or 0)
        decode_s = (self.finished or 0) - (self.first_token or 0)
        prefill_tps = (self.prompt_tokens - self.cached_tokens) / prefill_s if prefill_s > 0 else 0.0
        decode_tps = (len(self.tokens) - 1) / decode_s if decode_s > 0 and len(self.tokens) > 1 else 0.0
        accept = f"{self.accepted / self.drafted:.2f}" if self.drafted else "-"
        return (f"{self.id} prompt={self.prompt_tokens} cached={self.cached_tokens} ttft={ttft:.3f}s "
                f"prefill={prefill_tps:.0f}tok/s decode={decode_tps:.1f}tok/s accept={accept} out={len(self.tokens)} "
                f"finish={self.finish_reason}")


@dataclass
class _Running:
    request: Request
    result: Result
    state: SequenceState
    done_prefill: int  # prompt tokens already in the state
    logits: torch.Tensor | None = None
    generator: torch.Generator | None = None
    drafter: MTPDrafter | None = None
    hidden: torch.Tensor | None = None  # last prefill chunk's hidden states (for the MTP head)
    # verified rows the MTP head has not observed yet (after a verify, or plain steps while speculation
    # was paused): their hidden states h_t [r, H] and the tokens t + 1 that follow them
    unobserved: list[tuple[torch.Tensor, list[int]]] = field(default_factory=list)

    def record(self, hidden_rows: torch.Tensor, tokens: list[int]) -> None:
        """Rows for the head to observe before it drafts again (copied: they may be a graph's buffers)."""
        if self.drafter is not None:
            self.unobserved.append((hidden_rows.clone(), list(tokens)))

    def take_unobserved(self) -> tuple[torch.Tensor, list[int]] | None:
        if not self.unobserved:
            return None
        rows = (torch.cat([h for h, _ in self.unobserved]), [t for _, tokens in self.unobserved for t in tokens])
        self.unobserved.clear()
        return rows


@dataclass
class _Launched:
    """A plain step whose tokens the host has not read yet: they stay on the device as the next
    step's input, and their copy to the host lands while that step runs."""
    runs: list[_Running]
    tokens: torch.Tensor  # [B] each row's next token, on the device
    host: torch.Tensor  # [B] their copy on the host (pinned on CUDA)
    copied: torch.cuda.Event | None  # recorded after the copy (None: a CPU copy is done when issued)

    def read(self) -> list[int]:
        if self.copied is not None:
            self.copied.synchronize()
        return self.host.tolist()


@dataclass(frozen=True)
class EngineConfig:
    max_context: int
    max_concurrency: int = 1
    prefill_chunk: int = 1024
    pending_timeout_ms: int = 600_000
    draft_tokens: int = 0  # > 0: MTP speculative decoding with this many drafts per step
    spec_max_batch: int = 1  # speculate while at most this many sequences decode; beyond, plain batched steps
    max_queued: int = 256  # requests waiting for admission beyond this are refused (QueueFull)
    kv_dtype: str = "int8"  # int8 (group-64) | bf16
    block_size: int = 64  # KV pool block, tokens
    max_frontiers: int = 32  # prefix-cache frontiers kept (each holds a GDN state snapshot)
    batched_decode: bool = True  # sequences in plain decode share one forward per step (weights read once)
    cuda_graphs: bool | None = None  # decode, verify and draft steps through captured graphs (graphs.py); None: on CUDA
    overlap_steps: bool = True  # graphed plain steps: the next one launches before the host reads this one's tokens


def build_engine(model, config: EngineConfig, clock: Callable[[], float] = time.monotonic,
                 media: MediaEncoder | None = None) -> Engine:
    """An engine over a KV pool of exactly --max-context tokens for `model`; with speculative
    decoding the MTP layer gets a one-layer pool of the same token capacity."""
    layers = {key: i for i, key in enumerate(model.kv_layers())}
    c = model.cfg
    layout = KVLayout(len(layers), c.num_kv_heads, c.head_dim, config.block_size, config.kv_dtype)
    recurrent = "linear_attention" in getattr(c, "layer_types", ())
    device = model.device  # the KV pools live beside the weights
    graphs = config.cuda_graphs if config.cuda_graphs is not None else device.type == "cuda"
    pool = BlockPool.for_context(layout, config.max_context, device)
    cache = PrefixCache(pool, layers, recurrent, config.max_frontiers)
    mtp_pool = None
    if config.draft_tokens:
        mtp_layout = KVLayout(1, c.num_kv_heads, c.head_dim, config.block_size, config.kv_dtype)
        mtp_pool = BlockPool.for_context(mtp_layout, config.max_context, device)
    engine = Engine(model, cache, config, clock, mtp_pool, media)
    if graphs:
        engine.graphs = GraphedDecoder(model, pool, layers, config.max_concurrency, model.dtype, config.draft_tokens,
                                       mtp_pool)
        engine.verify_rows = engine.graphs.verify_batch
        if engine.graphs.slab is not None:  # a sequence's GDN state is shaped as a slot of the slab
            slab = engine.graphs.slab
            cache.slabs.prepare({i: t[0] for i, t in slab.conv.items()}, {i: t[0] for i, t in slab.recurrent.items()})
    return engine


class Engine:
    def __init__(self, model, cache: PrefixCache, config: EngineConfig, clock: Callable[[], float] = time.monotonic,
                 mtp_pool: BlockPool | None = None, media: MediaEncoder | None = None):
        if config.draft_tokens and mtp_pool is None:
            raise ValueError("speculative decoding needs a KV pool for the MTP layer (use build_engine)")
        self.model, self.cache, self.config, self.clock, self.mtp_pool = model, cache, config, clock, mtp_pool
        self.media = media
        self.waiting: deque[tuple[Request, Result]] = deque()
        self.running: list[_Running] = []
        self.spec_stats = SpecStats()
        self._listeners: dict[str, Callable[[Result], None]] = {}
        self.on_finish: list[Callable[[Result], None]] = []  # observers of every finished result (metrics)
        self._ids = itertools.count(1)
        self.graphs: GraphedDecoder | None = None  # set by build_engine where decode steps are captured
        # the target forward of speculative verifies: (token lists, states) -> [(hidden, logits)] per
        # sequence; one at a time here, all in one graphed forward with graphs (verify_batch)
        self.verify_rows = lambda token_lists, states: [model.forward(tokens, state)
                                                        for tokens, state in zip(token_lists, states)]
        self._launched: _Launched | None = None  # a plain step launched, its tokens not read yet
        self._token_hosts: list[torch.Tensor] = []  # two host buffers for its tokens, used in turn

    # -- requests ------------------------------------------------------------------------------
    def submit(self, request: Request) -> Result:
        if not request.prompt:
            raise RequestRejected("the prompt is empty")
        need = len(request.prompt) + request.max_tokens
        if len(request.prompt) >= self.config.max_context or need > self.config.max_context:
            raise RequestRejected(f"prompt of {len(request.prompt)} tokens + max_tokens {request.max_tokens} = {need} "
                                  f"exceeds the context of {self.config.max_context} tokens")
        if request.mm is not None and self.media is None:
            raise RequestRejected("image inputs need an artifact with a vision tower served with --vision")
        if len(self.waiting) >= self.config.max_queued:
            raise QueueFull(f"{len(self.waiting)} requests are already waiting for admission "
                            f"(--max-queued-requests {self.config.max_queued})")
        request.id = request.id or f"req-{next(self._ids)}"
        result = Result(request.id, prompt_tokens=len(request.prompt), submitted=self.clock())
        if request.on_update is not None:
            self._listeners[request.id] = request.on_update
        self.waiting.append((request, result))
        return result

    def cancel(self, request_id: str) -> None:
        """Stop a request now; its KV blocks return to the pool before this returns."""
        for i, (req, res) in enumerate(self.waiting):
            if req.id == request_id:
                del self.waiting[i]
                self._finish_result(res, "cancelled")
                return
        for run in self.running:
            if run.request.id == request_id:
                self._retire(run, "cancelled", keep_frontier=False)
                return

    # -- scheduling ----------------------------------------------------------------------------
    def _admit(self) -> None:
        now = self.clock()
        timeout = self.config.pending_timeout_ms / 1000
        while self.waiting and now - self.waiting[0][1].submitted > timeout:
            _, res = self.waiting.popleft()
            res.error = f"expired while waiting for admission ({self.config.pending_timeout_ms} ms)"
            self._finish_result(res, "expired")
        while self.waiting and len(self.running) < self.config.max_concurrency:
            req, res = self.waiting.popleft()
            state, cached = self.cache.start(req.key)
            res.cached_tokens, res.admitted = cached, now
            if req.mm is not None:
                if bool((req.mm.image_rows >= cached).any()):  # images a reused prefix does not cover
                    req.mm.embeds = self.media.encode(req.mm.images)
                state.mm = req.mm
            gen = None if req.params.seed is None else torch.Generator().manual_seed(req.params.seed)
            drafter = None
            if self.config.draft_tokens:
                # the head's KV lives in the same pool; it starts at the end of a reused prefix
                drafter = MTPDrafter(self.model, PagedKV(self.mtp_pool, {-1: 0}), position_offset=cached)
                drafter.state.mm = req.mm
            if self.graphs is not None:
                self.graphs.attach(state)  # its GDN state lives in the decode graphs' slab from now on
            self.running.append(_Running(req, res, state, cached, generator=gen, drafter=drafter))
            self._notify(res)  # admitted: cached_tokens is known

    def _ensure_room(self, run: _Running, tokens: int) -> None:
        """Blocks for `tokens` more tokens of `run`, evicting frontiers if needed, taken now: the next
        sequence of a batched step must not count them free too (PoolExhausted if they cannot be had)."""
        bs = self.cache.pool.layout.block_size
        need = -(-(run.state.length + tokens) // bs) - len(run.state.kv.blocks)
        if need > 0:
            self.cache.make_room(need)
            run.state.kv.reserve(run.state.length + tokens)

    def _advance(self, run: _Running) -> None:
        req = run.request
        if run.done_prefill < len(req.prompt):
            start = run.done_prefill
            end = min([start + self.config.prefill_chunk] + [p for p in req.snapshot_at if start < p < len(req.prompt)])
            chunk = req.prompt[start:end]
            self._ensure_room(run, len(chunk))
            hidden, logits = self.model.forward(torch.tensor(chunk), run.state, last_logits=True)
            run.done_prefill += len(chunk)
            if run.done_prefill in req.snapshot_at and run.done_prefill < len(req.prompt):
                self.cache.snapshot(req.key[: run.done_prefill], run.state)
            if run.drafter is not None and run.done_prefill < len(req.prompt):
                run.drafter.observe(hidden, torch.tensor(req.prompt[start + 1 : run.done_prefill + 1]))
            if run.done_prefill < len(req.prompt):
                return
            run.logits, run.hidden = logits[-1], hidden
        if run.result.first_token is None:
            token = next_token(run.logits, req.params, run.generator)
            run.result.first_token = self.clock()
            if run.drafter is not None:
                start = len(req.prompt) - run.hidden.shape[0]
                run.drafter.observe(run.hidden, torch.tensor(req.prompt[start + 1 :] + [token]))
            self._emit(run, [token], fed=0)
            return
        self._ensure_room(run, 1)  # plain decode, one sequence (speculating ones go through _speculate)
        hidden, logits = self.model.forward(torch.tensor(run.result.tokens[-1:]), run.state, last_logits=True)
        token = next_token(logits[-1], req.params, run.generator)
        run.record(hidden[-1:], [token])
        self._emit(run, [token], fed=1)

    def _speculate(self, runs: list[_Running]) -> None:
        """One speculative step of every run: each proposes its drafts, then the target verifies them,
        those with as many drafts in one forward (verify_rows: graphed, the weights read once for all
        of them), and each keeps its accepted prefix and one more token."""
        by_count: dict[int, list[tuple[_Running, torch.Tensor]]] = {}
        for run in runs:
            n = min(self.config.draft_tokens, run.request.max_tokens - len(run.result.tokens))
            try:
                self._ensure_room(run, n + 1)
                tokens = self._draft(run, n)  # [last, *drafts]: on the device when graphed
            except PoolExhausted as e:
                self._fail(run, e)
                continue
            by_count.setdefault(n, []).append((run, tokens))
        for group in by_count.values():
            states = [run.state for run, _ in group]
            with keeping_steps(states):
                rows = self.verify_rows([tokens for _, tokens in group], states)
            for (run, tokens), (hidden, logits) in zip(group, rows):
                drafts = tokens[1:]
                new = accept(run.state, drafts, hidden, logits, run.request.params, run.generator, self.spec_stats)
                run.result.drafted += len(drafts)
                run.result.accepted += len(new) - 1
                run.record(run.state.verified_hidden, new)  # observed with the next drafts
                self._emit(run, new, fed=len(new))

    def _draft(self, run: _Running, n: int) -> torch.Tensor:
        """The head observes what it has not seen yet, then proposes n drafts -> the verify's tokens
        [last, *drafts]. Graphed: one step for the rows a verify leaves (up to draft_tokens + 1; a
        longer backlog, after a pause, first in one eager forward), its tokens left on the device."""
        rows, last = run.take_unobserved(), run.result.tokens[-1]
        if rows is not None and (self.graphs is None or len(rows[1]) > self.config.draft_tokens + 1):
            run.drafter.observe(rows[0], torch.tensor(rows[1]))
            rows = None
        if self.graphs is None:
            return torch.tensor([last, *run.drafter.propose(n)])
        return self.graphs.propose_tokens(run.drafter, n, last, observe=rows)

    def _emit(self, run: _Running, new: list[int], fed: int) -> None:
        """Append sampled tokens, stopping at a stop token/callback or max_tokens. `fed` is how many
        tokens the last forward fed (the previous token plus accepted drafts); on an early stop the
        state is rolled back so it holds exactly prompt + output[:-1]."""
        req, res = run.request, run.result
        for i, token in enumerate(new):
            res.tokens.append(token)
            reason = None
            if token in req.stop_token_ids or (req.stop is not None and req.stop(res.tokens)):
                reason = "stop"
            elif len(res.tokens) >= req.max_tokens:
                reason = "length"
            if reason:
                if fed and i + 1 < fed:
                    run.state.rollback(i + 1)
                self._retire(run, reason)
                return
        self._notify(res)

    def _batchable(self, run: _Running) -> bool:
        """It can join a batched forward (a graphed one unless its prompt has images)."""
        return self.graphs is None or self.graphs.supports(run.state)

    def _decode_batch(self, runs: list[_Running]) -> None:
        """One forward for the next token of every run (each attends over its own KV and state). If
        the step before was launched with the same runs, its tokens are this step's input on the
        device, and the host reads them once this step is launched."""
        launched, self._launched = self._launched, None
        if launched is not None and not self._room_for(runs):
            self._land(launched)  # a run fails for want of blocks: first its tokens so far
            launched, runs = None, [run for run in runs if self._is_running(run)]
        ready = []
        for run in runs:
            try:
                self._ensure_room(run, 1)
                ready.append(run)
            except PoolExhausted as e:
                self._fail(run, e)
        if not ready:
            return
        tokens = launched.tokens if launched is not None else [run.result.tokens[-1] for run in ready]
        states = [run.state for run in ready]
        if self.graphs is not None:
            hidden, logits = self.graphs.decode_rows(tokens, states)
        else:
            hidden, logits = self.model.decode_batch_rows(torch.tensor(tokens), states)
        if self._overlaps(ready):
            self._launched = self._launch(ready, logits)
            if launched is not None:
                self._land(launched)
            if not any(self._is_running(run) for run in ready):
                self._launched = None  # every run stopped on the landed tokens: nothing reads these
            return
        chosen = next_tokens(logits, [run.request.params for run in ready], [run.generator for run in ready])
        for b, (run, token) in enumerate(zip(ready, chosen)):
            run.record(hidden[b : b + 1], [token])
            self._emit(run, [token], fed=1)

    def _overlaps(self, runs: list[_Running]) -> bool:
        """The next step of these runs may launch before their tokens are read: graphed (greedy or sampled:
        both are chosen on the device) and no MTP head to feed the hidden states to."""
        return self.config.overlap_steps and self.graphs is not None and all(run.drafter is None for run in runs)

    def _continues(self, launched: _Launched, batch: list[_Running]) -> bool:
        """This step is the launched one's successor: the same runs, none finishing on its tokens by length."""
        return (len(batch) == len(launched.runs) and all(a is b for a, b in zip(batch, launched.runs))
                and all(len(run.result.tokens) + 1 < run.request.max_tokens for run in batch))

    def _room_for(self, runs: list[_Running]) -> bool:
        try:
            for run in runs:
                self._ensure_room(run, 1)
        except PoolExhausted:
            return False
        return True

    def _launch(self, runs: list[_Running], logits: torch.Tensor) -> _Launched:
        """Each row's next token, left on the device, and its copy to a host buffer (the one the last
        launched step did not use), without waiting for it."""
        if not self._token_hosts:
            pin = logits.is_cuda
            self._token_hosts = [torch.zeros(self.config.max_concurrency, dtype=torch.long, pin_memory=pin)
                                 for _ in range(2)]
        self._token_hosts.reverse()
        tokens = next_token_ids(logits, [run.request.params for run in runs], [run.generator for run in runs])
        host = self._token_hosts[0][: len(runs)]
        host.copy_(tokens, non_blocking=True)
        copied = None
        if tokens.is_cuda:
            copied = torch.cuda.Event()
            copied.record()
        return _Launched(list(runs), tokens, host, copied)

    def _land(self, launched: _Launched) -> None:
        """Emit a launched step's tokens to its runs still running (one cancelled meanwhile gets none)."""
        for run, token in zip(launched.runs, launched.read()):
            if self._is_running(run):
                self._emit(run, [token], fed=1)

    def _is_running(self, run: _Running) -> bool:
        return any(run is r for r in self.running)

    def drain(self) -> None:
        """Emit the tokens of a step still being read (overlapped steps), so every result is up to date."""
        launched, self._launched = self._launched, None
        if launched is not None:
            self._land(launched)

    def _fail(self, run: _Running, error: Exception) -> None:
        run.result.error = str(error)
        self._retire(run, "error", keep_frontier=False)

    def step(self) -> None:
        self._admit()
        batch, speculating = self._plan()
        if self._launched is not None and not self._continues(self._launched, batch):
            self.drain()  # the batch changes, or a run ends on these tokens: read them first
            batch, speculating = self._plan()
        self._decode_batch(batch)
        self._speculate(speculating)
        done = {id(run) for run in batch + speculating}
        for run in list(self.running):
            if id(run) in done:
                continue
            try:
                self._advance(run)
            except PoolExhausted as e:
                self._fail(run, e)

    def _plan(self) -> tuple[list[_Running], list[_Running]]:
        """This step's (plain batch, speculating runs)."""
        decoding = [run for run in self.running if run.result.first_token is not None]
        speculate = len(decoding) <= self.config.spec_max_batch
        speculating = [run for run in decoding if run.drafter is not None and speculate]
        plain = [run for run in decoding if run.drafter is None or not speculate]
        batch = [run for run in plain if self._batchable(run)] if self.config.batched_decode else []
        if len(batch) < 2 and self.graphs is None:
            batch = []  # one sequence takes the plain path (unless steps are graphed)
        return batch, speculating

    def run_until_done(self, max_steps: int = 1_000_000) -> None:
        for _ in range(max_steps):
            if not self.waiting and not self.running:
                return
            self.step()

    # -- bookkeeping ---------------------------------------------------------------------------
    def _finish_result(self, res: Result, reason: str) -> None:
        res.finish_reason, res.finished = reason, self.clock()
        log.info(res.log_line())
        for observe in self.on_finish:
            observe(res)
        self._notify(res)

    def _notify(self, res: Result) -> None:
        listener = self._listeners.get(res.id)
        if listener is not None:
            listener(res)
            if res.done:
                del self._listeners[res.id]

    def _retire(self, run: _Running, reason: str, keep_frontier: bool = True) -> None:
        self.running.remove(run)
        tokens = run.request.key + run.result.tokens
        # the last sampled token was never fed to the model; the frontier is what the state holds
        held = tokens[: run.state.length]
        if keep_frontier and run.state.length == len(held) and run.done_prefill == len(run.request.prompt):
            self.cache.insert(held, run.state)
        else:
            run.state.kv.release()
        if run.drafter is not None:
            run.drafter.state.kv.release()
        if self.graphs is not None:  # the frontier took its copies: the slot's state is not copied out again
            self.graphs.release(run.state, keep_state=False)
        self._finish_result(run.result, reason)

    def counters(self) -> dict:
        pool = self.cache.pool
        return {"queue_depth": len(self.waiting),
                "prefilling": sum(1 for r in self.running if r.done_prefill < len(r.request.prompt)),
                "decoding": sum(1 for r in self.running if r.done_prefill >= len(r.request.prompt)),
                "pool_used_blocks": pool.num_blocks - pool.free_blocks, "pool_blocks": pool.num_blocks,
                "frontiers": len(self.cache.frontiers), "spec_acceptance_rate": self.spec_stats.acceptance_rate,
                "spec_tokens_per_step": self.spec_stats.tokens_per_step}
