"""tools/analyze_log.py over lines the engine itself writes (Result.log_line)."""

import json

from ninfer_run.engine import Result

from analyze_log import analyze, main, parse


def _line(i, prompt, cached, ttft, out, decode_s=2.0, finish="length", drafted=0, accepted=0):
    r = Result(f"req-{i}", tokens=[0] * out, finish_reason=finish, prompt_tokens=prompt, cached_tokens=cached,
               submitted=100.0, admitted=100.5, first_token=100.0 + ttft, finished=100.0 + ttft + decode_s,
               drafted=drafted, accepted=accepted)
    return f"2026-12-02 10:00:00,000 ninfer.engine {r.log_line()}"


def _log():
    lines = ["INFO:     Started server process", "unrelated line prompt=maybe"]
    # small prompts mostly hit the cache; big ones always reset (the seed's pattern)
    lines += [_line(i, 20_000, 15_000 if i % 4 else 0, 1.0, 101) for i in range(8)]
    lines += [_line(10 + i, 120_000, 0, 30.0 + i, 201, drafted=30, accepted=15) for i in range(4)]
    lines.append(_line(20, 170_000, 0, 60.0, 0, finish="cancelled"))
    return lines


def test_tables_from_engine_lines():
    records = parse(_log())
    assert len(records) == 13 and records[0].prompt == 20_000 and records[-1].finish == "cancelled"
    a = analyze(records, [50_000, 100_000, 160_000])
    prompt = 8 * 20_000 + 4 * 120_000 + 170_000
    generated = 8 * 101 + 4 * 201
    assert a["prompt_tokens"] == prompt and a["generated_tokens"] == generated
    assert abs(a["prefill_share_of_work"] - prompt / (prompt + generated)) < 1e-12
    reuse = a["reuse_by_prompt_size"]
    assert set(reuse) == {"<50K", "100-160K", ">=160K"}
    assert reuse["<50K"]["full_reset"] == 0.25 and reuse["<50K"]["hit"] == 0.75
    assert reuse["100-160K"]["full_reset"] == 1.0 and reuse["100-160K"]["ttft"]["median"] == 31.5
    assert a["decode_tok_s"]["median"] == 50.0  # 100 tokens after the first in 2 s
    assert a["acceptance"]["median"] == 0.5 and a["finished"] == {"cancelled": 1, "length": 12}


def test_cli_writes_json_and_plot(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_text("\n".join(_log()))
    assert main([str(log), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "prefill is" in printed and "<50K" in printed
    data = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert data["analysis"]["requests"] == 13 and len(data["records"]) == 13
    assert (tmp_path / "out" / "analysis.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    assert main([str(empty)]) == 1
