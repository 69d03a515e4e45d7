"""Prompts rendered and tokenized from the artifact equal transformers' apply_chat_template."""

import pytest

from ninfer_format import Artifact
from ninfer_run.chat import Chat, TemplateError

transformers = pytest.importorskip("transformers")

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
CONVERSATIONS = [
    [{"role": "user", "content": "hello there"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Summarize: the cache is warm."}],
    [{"role": "user", "content": "open main.py"},
     {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "read_file",
                                                                                          "arguments": {"path": "main.py"}}}]},
     {"role": "tool", "content": "print('hi')"},
     {"role": "user", "content": "and now?"}],
    [{"role": "user", "content": "think first"}, {"role": "assistant", "content": "done", "reasoning_content": "hmm"},
     {"role": "user", "content": "again, with ünïcode ✓"}],
]


@pytest.mark.parametrize("model_id", ["tiny-qwen3.5", "tiny-qwen3"])
@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("with_tools", [False, True])
def test_render_and_tokens_match_transformers(model_id, case, with_tools, packed, tiny_checkpoints):
    messages, tools = CONVERSATIONS[case], TOOLS if with_tools else None
    with Artifact(packed(model_id)) as a:
        chat = Chat.from_artifact(a)
    hf = transformers.AutoTokenizer.from_pretrained(tiny_checkpoints[model_id])
    for kwargs in ({}, {"enable_thinking": False}):
        ours = chat.render(messages, tools=tools, **kwargs)
        theirs = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs)
        assert ours == theirs
        ids = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, **kwargs)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert chat.encode(ours) == list(ids)
    assert chat.decode(chat.encode("round trip ✓")) == "round trip ✓"


def test_template_errors_are_clear(packed):
    with Artifact(packed("tiny-qwen3.5")) as a:
        chat = Chat.from_artifact(a)
    with pytest.raises(TemplateError, match="No user query"):
        chat.render([{"role": "assistant", "content": "x"}])
