"""Chat templates render like transformers' `apply_chat_template(add_generation_prompt=True)`."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from api.engine.local_engine import load_chat_template
from api.engine.protocol import ChatMessage, ToolCall
from api.engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from tests.engine.conftest import DEMO_DIR, make_engine

MESSAGES = [
    ChatMessage("system", "You are terse."),
    ChatMessage("user", "Привет! What's 2+2?"),
    ChatMessage("assistant", "4"),
    ChatMessage("user", 'And "quoted" 🙂'),
]

# A llama-3 style template: bos, loop controls, tojson, whitespace control, raise_exception.
LLAMA_LIKE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system = '' %}
{%- endif %}
{{- '<|start|>system\\n' + system + '<|eot|>' }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('Unknown role ' + message['role']) }}
    {%- endif %}
    {%- if loop.index0 > 50 %}{% break %}{% endif %}
    {{- '<|start|>' + message['role'] + '\\n' + message['content'] | trim + '<|eot|>' }}
    {{- '<|meta|>' + (message | tojson) }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start|>assistant\\n' }}{%- endif %}
{{- strftime_now('%Y') | length * '' }}"""


def transformers_render(template: str) -> str:
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(DEMO_DIR / "tokenizer.json"))
    tokenizer.bos_token = "<|endoftext|>"
    tokenizer.eos_token = "<|im_end|>"
    conversation = [{"role": m.role, "content": m.content} for m in MESSAGES]
    return tokenizer.apply_chat_template(
        conversation, chat_template=template, add_generation_prompt=True, tokenize=False
    )


@pytest.mark.parametrize("template", [CHATML_TEMPLATE, LLAMA_LIKE])
def test_renders_exactly_like_transformers(template: str) -> None:
    ours = ChatTemplate(template, {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
    assert ours.render(MESSAGES) == transformers_render(template)


def test_raise_exception_refuses_the_conversation() -> None:
    template = ChatTemplate(LLAMA_LIKE, {"bos_token": "<s>"})
    with pytest.raises(ChatTemplateError, match="Unknown role tool"):
        template.render([ChatMessage("tool", "x")])


def test_templates_run_sandboxed() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}", {})
    with pytest.raises(ChatTemplateError):
        template.render(MESSAGES)


def test_a_model_without_template_gets_chatml(tmp_path) -> None:
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    template = load_chat_template(tmp_path)
    assert template.render([ChatMessage("user", "hi")]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_demo_prompt_tokens_equal_transformers_apply_chat_template() -> None:
    from transformers import AutoTokenizer

    engine = make_engine(DEMO_DIR)
    hf = AutoTokenizer.from_pretrained(str(DEMO_DIR))
    conversation = [{"role": m.role, "content": m.content} for m in MESSAGES]
    expected = hf.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    assert engine.encode_chat(MESSAGES) == list(expected)


def test_the_demo_template_renders_tools_and_calls_like_transformers() -> None:
    """Qwen2.5's tool format: tools in the system turn, calls as `<tool_call>` blocks with
    their arguments as JSON, results as `<tool_response>` in a user turn."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The forecast.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    messages = [
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", '{"sky": "clear"}', tool_call_id="call_1", name="get_weather"),
    ]
    ours = load_chat_template(DEMO_DIR).render(messages, tools=tools)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(DEMO_DIR / "tokenizer.json"))
    conversation = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": '{"sky": "clear"}', "tool_call_id": "call_1"},
    ]
    theirs = tokenizer.apply_chat_template(
        conversation,
        tools=tools,
        chat_template=(DEMO_DIR / "chat_template.jinja").read_text(),
        add_generation_prompt=True,
        tokenize=False,
    )
    assert ours == theirs
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in ours
    )
    assert '<tool_response>\n{"sky": "clear"}\n</tool_response>' in ours
