"""Render a model's Jinja chat template the way transformers' `apply_chat_template` does.

Templates come from the model's files, so they are untrusted code: they run in Jinja's immutable
sandbox. The environment mirrors transformers (trim_blocks, lstrip_blocks, loop controls, the
`{% generation %}` tag, `tojson` without ASCII escaping, `raise_exception`, `strftime_now`) and the
render receives the special tokens as strings (`bos_token`, `eos_token`, ...) and
`add_generation_prompt=True`, so a prompt rendered here tokenizes to the same ids as in PyTorch.
Models without a template get ChatML, the format most chat models (and vLLM's fallback) use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from api.engine.protocol import ChatMessage

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template refused the conversation (`raise_exception`) or failed to render."""


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in
    transformers; for rendering it is a no-op, but templates that use it must still parse."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special-token strings it is rendered with."""

    def __init__(self, source: str | None, special_tokens: Mapping[str, Any]) -> None:
        self.source = source or CHATML_TEMPLATE
        self._special_tokens = dict(special_tokens)
        try:
            self._template = _environment().from_string(self.source)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc

    @property
    def renders_tools(self) -> bool:
        """Whether the template shows tools (transformers passes them as `tools`)."""
        return "tools" in self.source

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        conversation = [_message(m) for m in messages]
        try:
            return self._template.render(
                messages=conversation,
                add_generation_prompt=add_generation_prompt,
                tools=list(tools) if tools else None,
                documents=None,
                **self._special_tokens,
            )
        except ChatTemplateError:
            raise
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc


def _message(message: ChatMessage) -> dict[str, Any]:
    """A message as transformers hands it to templates: calls' arguments as objects (templates
    write them with `tojson`), a tool result with the id and name of its call."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON: shown as the model wrote it


def select_template(raw: str | list | None) -> str | None:
    """`tokenizer_config.json`'s `chat_template` is a string or a list of named templates."""
    if raw is None or isinstance(raw, str):
        return raw
    named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
    return named.get("default") or next(iter(named.values()), None)


def special_token_strings(*configs: Mapping[str, Any]) -> dict[str, Any]:
    """bos/eos/unk/pad tokens (and additional ones) as plain strings, later configs winning."""
    out: dict[str, Any] = {}
    for config in configs:
        for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token"):
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                out[key] = value
        extra = config.get("additional_special_tokens")
        if isinstance(extra, list):
            out["additional_special_tokens"] = [
                t.get("content") if isinstance(t, dict) else t for t in extra
            ]
    return out
