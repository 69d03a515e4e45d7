"""Tool calls and reasoning recovered from text in the exact format the chat templates teach."""

import random

import pytest

from ninfer_format import Artifact
from ninfer_run.chat import Chat
from ninfer_run.output_parser import OutputParser, parse_all

STYLE = {"tiny-qwen3.5": "qwen3_xml", "tiny-qwen3": "qwen3_json"}
CALLS = [{"name": "read_file", "arguments": {"path": "src/main.py", "lines": 40}},
         {"name": "run", "arguments": {"cmd": "pytest -q", "env": {"CI": "1"}, "flags": ["-x", "-q"]}}]


def _assistant_text(chat: Chat, content: str, calls: list[dict]) -> str:
    """What the model writes for such a turn: the template's rendering of the assistant message."""
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": content, "tool_calls": [{"type": "function", "function": c} for c in calls]}]
    text = chat.render(messages, add_generation_prompt=False)
    body = text.split("<|im_start|>assistant\n", 1)[1]
    return body.rsplit("<|im_end|>", 1)[0]


@pytest.mark.parametrize("model_id", list(STYLE))
@pytest.mark.parametrize("content", ["", "Let me look."])
def test_template_rendered_tool_calls_parse_back(model_id, content, packed):
    with Artifact(packed(model_id)) as a:
        chat = Chat.from_artifact(a)
    text = _assistant_text(chat, content, CALLS)
    text = text.split("</think>", 1)[-1].lstrip("\n")  # the thinking block the template may add
    whole = parse_all(text, STYLE[model_id])
    assert [(c.name, c.arguments) for c in whole.tool_calls] == [(c["name"], c["arguments"]) for c in CALLS]
    assert whole.content.strip() == content
    for trial in range(5):  # any split into streamed deltas gives the same result
        rng = random.Random(trial)
        parser, pieces, i = OutputParser(STYLE[model_id]), [], 0
        while i < len(text):
            n = rng.randint(1, 7)
            pieces.append(parser.feed(text[i : i + n]))
            i += n
        pieces.append(parser.finish())
        assert [c for p in pieces for c in p.tool_calls] == whole.tool_calls
        assert "".join(p.content for p in pieces).strip() == content
        assert all("<tool" not in p.content for p in pieces)


def test_reasoning_split_streaming():
    text = "weighing options\nstill</think>\n\nThe answer is 4."
    parser = OutputParser("qwen3_xml", in_reasoning=True)
    deltas = [parser.feed(ch) for ch in text] + [parser.finish()]
    assert "".join(d.reasoning for d in deltas) == "weighing options\nstill"
    assert "".join(d.content for d in deltas) == "The answer is 4."
    assert all("<" not in d.reasoning and "</" not in d.content for d in deltas)
    opened = parse_all("<think>plan</think>done", "qwen3_json")
    assert (opened.reasoning, opened.content) == ("plan", "done")


def test_broken_tool_call_stays_content():
    out = parse_all('<tool_call>\n{"name": broken\n</tool_call>', "qwen3_json")
    assert not out.tool_calls and "broken" in out.content
    unfinished = parse_all("text <tool_call>\n<function=x>", "qwen3_xml")
    assert not unfinished.tool_calls and unfinished.content.endswith("<function=x>")
