"""Chat template and tokenizer from the artifact: prompts rendered exactly as transformers renders them.

The template runs in jinja2's immutable sandbox with the same environment transformers'
`apply_chat_template` builds (trim_blocks, lstrip_blocks, loopcontrols, a non-escaping `tojson`,
`raise_exception`, `strftime_now`, dunder-free namespaces), so the token ids match
`tokenizer.apply_chat_template(...)` (tests/run/test_chat.py). Templates are untrusted input:
the sandbox, not the template, decides what may run.
"""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from ninfer_format import Artifact

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class TemplateError(ValueError):
    """The chat template rejected the conversation (its raise_exception) or failed to render."""


class _Namespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"templates may not set underscore attributes ({name!r})")


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       namespace=_Namespace, dict=dict)
    return env.from_string(source)


def _alias_reasoning(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        out.append({"thinking": reasoning, **m, "reasoning_content": reasoning} if reasoning is not None else dict(m))
    return out


class Chat:
    """Renders and tokenizes conversations for one artifact."""

    def __init__(self, template: str, tokenizer: Tokenizer, special_tokens: dict[str, str | None]):
        self.template = compile_template(template)
        self.tokenizer = tokenizer
        self.special_tokens = special_tokens

    @classmethod
    def from_artifact(cls, artifact: Artifact) -> Chat:
        config = json.loads(artifact.blob("tokenizer_config.json")) if artifact.has_blob("tokenizer_config.json") else {}
        if artifact.has_blob("chat_template.jinja"):
            template = artifact.blob("chat_template.jinja").decode()
        elif isinstance(config.get("chat_template"), str):
            template = config["chat_template"]
        else:
            raise ValueError(f"{artifact.path.name} has no chat template (chat_template.jinja or tokenizer_config.json)")
        tokenizer = Tokenizer.from_str(artifact.blob("tokenizer.json").decode())
        specials = {k: config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return cls(template, tokenizer, {k: v if isinstance(v, str) or v is None else v.get("content") for k, v in specials.items()})

    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True,
               **template_kwargs) -> str:
        try:
            return self.template.render(messages=_alias_reasoning(messages), tools=tools,
                                        add_generation_prompt=add_generation_prompt,
                                        **self.special_tokens, **template_kwargs)
        except jinja2.exceptions.TemplateError as e:
            raise TemplateError(str(e)) from None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
