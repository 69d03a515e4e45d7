"""CPU figures of the pure-torch reference engine on the tiny hybrid model (issue 4's closing numbers).

    python tools/bench_reference.py [--out out/bench]

Builds the tiny checkpoint, packs it (int4), and reports prefill and decode tok/s, the INT8 KV
pool's size, prefix-reuse hits over an agent-like session, and MTP acceptance (random weights: the
draft head is untrained, so acceptance is near zero; the speculative machinery is what is timed).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch

from ninfer_pack.build import PackOptions, run_pack
from ninfer_run.engine import Engine, EngineConfig, Request, build_engine
from ninfer_run.loader import load

from bench_common import write_results
from make_tiny_checkpoint import build


def _engine(model, draft_tokens: int) -> Engine:
    return build_engine(model, EngineConfig(max_context=4096, max_concurrency=1, prefill_chunk=256,
                                            draft_tokens=draft_tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/bench")))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = build("tiny-qwen3.5", Path(tmp) / "ckpt")
        art = Path(tmp) / "tiny.ninfer"
        run_pack(PackOptions(model_id="tiny-qwen3.5", profile="int4", source=src, output=art))
        model = load(art).model
        g = torch.Generator().manual_seed(0)
        results = {}
        for draft in (0, 3):
            engine = _engine(model, draft)
            history = torch.randint(0, 512, (400,), generator=g).tolist()
            turns = []
            for _ in range(4):
                r = engine.submit(Request(history, max_tokens=32))
                engine.run_until_done()
                turns.append(r)
                history = history + r.tokens + torch.randint(0, 512, (50,), generator=g).tolist()
            first = turns[0]
            prefill_tps = (first.prompt_tokens - first.cached_tokens) / (first.first_token - first.admitted)
            decode_tps = sum(len(t.tokens) - 1 for t in turns) / sum(t.finished - t.first_token for t in turns)
            stats = engine.cache.stats
            results[f"draft{draft}"] = {
                "prefill_tok_per_s": prefill_tps, "decode_tok_per_s": decode_tps,
                "cached_fraction": stats.cached_tokens / stats.prompt_tokens,
                "acceptance_rate": engine.spec_stats.acceptance_rate, "tokens_per_step": engine.spec_stats.tokens_per_step,
                "log_lines": [t.log_line() for t in turns],
            }
            print(f"draft_tokens={draft}: prefill {prefill_tps:.0f} tok/s, decode {decode_tps:.1f} tok/s, "
                  f"cached {stats.cached_tokens}/{stats.prompt_tokens} prompt tokens, "
                  f"acceptance {engine.spec_stats.acceptance_rate:.1%}, {engine.spec_stats.tokens_per_step:.2f} tok/step")
            for t in turns:
                print("   ", t.log_line())
        results["threads"] = torch.get_num_threads()
        results["agent_sessions"] = _agent_sessions(model, args.out / "bench_reference_cpu.log")
    write_results(args.out, "bench_reference_cpu", results)


def _agent_sessions(model, log_path: Path) -> dict:
    """Four agent-like sessions at --max-concurrency 2: three grow turn by turn (reusable prefixes),
    one starts over each turn (full resets). The per-request log lines go to `log_path` for
    tools/analyze_log.py."""
    engine = build_engine(model, EngineConfig(max_context=8192, max_concurrency=2, prefill_chunk=256))
    g = torch.Generator().manual_seed(1)
    histories = [torch.randint(0, 512, (300 + 250 * i,), generator=g).tolist() for i in range(4)]
    lines = []
    for _turn in range(6):
        live = [engine.submit(Request(h, max_tokens=24)) for h in histories]
        engine.run_until_done()
        lines += [r.log_line() for r in live]
        for i, r in enumerate(live):
            fresh = torch.randint(0, 512, (60,), generator=g).tolist()
            histories[i] = torch.randint(0, 512, (len(histories[i]),), generator=g).tolist() if i == 3 else \
                histories[i] + r.tokens + fresh
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("\n".join(lines) + "\n")
    stats = engine.cache.stats
    print(f"agent sessions: {len(lines)} requests, cached {stats.cached_tokens}/{stats.prompt_tokens} prompt tokens "
          f"-> {log_path}")
    return {"requests": len(lines), "cached_fraction": stats.cached_tokens / stats.prompt_tokens,
            "log": str(log_path)}


if __name__ == "__main__":
    main()
