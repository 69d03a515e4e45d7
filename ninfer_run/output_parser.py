"""Split model output into reasoning, content and tool calls, incrementally (for streaming too).

Formats are the ones the families' chat templates teach the model:
    qwen3_xml  (Qwen3.5/3.8): <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>
    qwen3_json (Qwen3):       <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
Reasoning is the text before `</think>` when the prompt opened a `<think>` block (or the model opens
one). Text that might be the start of a tag is held back until it is decided, so a streamed
delta never splits a tag. A tool call that cannot be parsed is returned as plain content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)


@dataclass
class ToolCall:
    name: str
    arguments: dict

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


def _parse_value(text: str):
    """Qwen's XML parameters are strings unless they read as JSON (numbers, booleans, objects, lists)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_tool_call(body: str, style: str) -> ToolCall | None:
    if style == "qwen3_json":
        try:
            obj = json.loads(body.strip())
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        return ToolCall(obj["name"], args if isinstance(args, dict) else {})
    m = _FUNCTION.search(body)
    if not m:
        return None
    return ToolCall(m.group(1).strip(), {k.strip(): _parse_value(v) for k, v in _PARAM.findall(m.group(2))})


def held_prefix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of one of the tags."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), 0, -1):
            if text.endswith(tag[:n]):
                best = max(best, n)
                break
    return best


class OutputParser:
    def __init__(self, style: str, in_reasoning: bool = False):
        if style not in ("qwen3_xml", "qwen3_json"):
            raise ValueError(f"unknown tool-call style {style!r}")
        self.style, self.in_reasoning = style, in_reasoning
        self._buf = ""
        self._in_call = False
        self._after_think = False  # newlines right after </think> separate blocks; they are not content

    def _content(self, out: Delta, text: str) -> None:
        if self._after_think:
            text = text.lstrip("\n")
            self._after_think = not text
        out.content += text

    def feed(self, text: str) -> Delta:
        self._buf += text
        out = Delta()
        while True:
            if self.in_reasoning:
                i = self._buf.find(THINK_CLOSE)
                if i < 0:
                    keep = held_prefix(self._buf, (THINK_CLOSE,))
                    out.reasoning += self._buf[: len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep :]
                    return out
                out.reasoning += self._buf[:i]
                self._buf = self._buf[i + len(THINK_CLOSE) :]
                self.in_reasoning, self._after_think = False, True
            elif self._in_call:
                i = self._buf.find(CALL_CLOSE)
                if i < 0:
                    return out
                body = self._buf[:i]
                self._buf = self._buf[i + len(CALL_CLOSE) :]
                self._in_call = False
                call = parse_tool_call(body, self.style)
                if call is None:
                    self._content(out, CALL_OPEN + body + CALL_CLOSE)
                else:
                    out.tool_calls.append(call)
            else:
                starts = [(self._buf.find(t), t) for t in (THINK_OPEN, CALL_OPEN)]
                starts = [(i, t) for i, t in starts if i >= 0]
                if not starts:
                    keep = held_prefix(self._buf, (THINK_OPEN, CALL_OPEN))
                    self._content(out, self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    return out
                i, tag = min(starts)
                self._content(out, self._buf[:i])
                self._buf = self._buf[i + len(tag) :]
                if tag == THINK_OPEN:
                    self.in_reasoning = True
                else:
                    self._in_call = True

    def finish(self) -> Delta:
        """End of generation: whatever is held back is emitted as it stands."""
        out = Delta()
        rest, self._buf = self._buf, ""
        if self.in_reasoning:
            out.reasoning = rest
        elif self._in_call:
            self._content(out, CALL_OPEN + rest)
        else:
            self._content(out, rest)
        self._in_call = False
        return out


def parse_all(text: str, style: str, in_reasoning: bool = False) -> Delta:
    """The whole output at once (non-streaming responses)."""
    p = OutputParser(style, in_reasoning)
    a, b = p.feed(text), p.finish()
    return Delta(a.reasoning + b.reasoning, (a.content + b.content).strip("\n") if a.tool_calls else a.content + b.content,
                 a.tool_calls + b.tool_calls)
