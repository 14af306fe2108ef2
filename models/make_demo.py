"""Build the demo model committed in `models/demo/` (and the tiny models the engine tests use).

No model hub is reachable where Tokenshop is built, so everything is made here: a byte-level BPE
tokenizer trained on generated text (English and Russian words, punctuation, a few emoji and CJK
characters so multi-byte UTF-8 gets split across tokens), a random-weight llama-family model from
a config, a ChatML chat template whose end token is the EOS (the demo's renders tools as
Qwen2.5 does), and an export by optimum-onnx in
Optimum's layout. Random weights serve the demo and the exactness tests as well as trained ones.

    python models/make_demo.py models/demo

Needs the `export` extra (torch, transformers, optimum-onnx); serving the result does not.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The demo's template: ChatML as above without tools; with tools, Qwen2.5's format (tools listed
# in the system turn, calls as `<tool_call>` blocks, results as `<tool_response>` user turns),
# so the demo shows function calling and a conversation renders as it would for Qwen2.5.
DEMO_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# The demo's context: Claude Code's first request is about 58,000 tokens in its tokenizer, and a
# session grows from there (docs/anthropic.md). Its rotary embedding has no learned positions.
DEMO_CONTEXT = 131072
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_WORDS_TEXT = (
    "the a token shop model answer question tokens stream batch engine pays stars "
    "telegram hello world price pack key balance request reply fast slow small large "
    "cache step привет мир токен ключ баланс модель ответ вопрос быстро звезда пакет "
    "цена über café naïve résumé 東京 数据 模型 🙂 🚀 ⭐ ✨"
)
_WORDS = _WORDS_TEXT.split()


_SYLLABLES_TEXT = (
    "ka to ri me sa no lu vi de an ex or ing tion pre con str ght qu zy ра ко ми ст "
    "но ли ва пре ть ся"
)
_SYLLABLES = _SYLLABLES_TEXT.split()


def corpus(lines: int = 6000, seed: int = 0) -> list[str]:
    """Deterministic pseudo-text: the tokenizer only needs realistic byte statistics."""
    rng = random.Random(seed)
    invented = ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(3000)]
    out = []
    for _ in range(lines):
        words = [
            rng.choice(_WORDS) if rng.random() < 0.4 else rng.choice(invented)
            for _ in range(rng.randint(3, 14))
        ]
        punct = rng.choice([".", "!", "?", ",", ":", " -", ""])
        out.append(" ".join(words).capitalize() + punct + rng.choice(["", " 42", " 2025", " (ok)"]))
    return out


def train_tokenizer(vocab_size: int = 2048, *, chat_template: str | None = CHATML_TEMPLATE) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` with ChatML special tokens, EOS `<|im_end|>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
    )


def build_model(arch: str, tokenizer: Any, *, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random-weight causal LM of `arch` sized to `tokenizer`.

    The init std is raised well above the usual 0.02 so next-token distributions are peaked:
    with near-flat logits greedy decoding would hinge on float rounding between PyTorch and ONNX
    Runtime, and the exactness tests would compare noise.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    if arch == "gpt2":
        shape: dict[str, Any] = dict(n_embd=64, n_layer=2, n_head=4, n_positions=2048)
    else:
        shape = dict(
            hidden_size=64,
            intermediate_size=176,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=2048,
        )
    shape.update(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos[0],
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    shape.update(overrides)
    config = AutoConfig.for_model(arch, **shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.eval()
    return model


def export(source: Path, out: Path) -> None:
    """optimum-onnx's `text-generation-with-past` export, with its tracing chatter silenced."""
    from optimum.exporters.onnx import main_export

    with warnings.catch_warnings():
        # The TorchScript exporter warns about tracing and its own deprecation; the export is
        # validated against PyTorch by optimum and by the engine's exactness tests instead.
        warnings.simplefilter("ignore")
        main_export(str(source), out, task="text-generation-with-past", do_validation=False)


def make_export(
    arch: str, out: Path, *, tokenizer: Any = None, **overrides: Any
) -> tuple[Any, Any]:
    """Save a tiny model + tokenizer as a transformers dir and export it to `out`."""
    tokenizer = tokenizer if tokenizer is not None else train_tokenizer()
    model = build_model(arch, tokenizer, **overrides)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        export(Path(tmp), out)
    return model, tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=Path(__file__).parent / "demo")
    args = parser.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    make_export(
        "llama",
        args.out,
        tokenizer=train_tokenizer(chat_template=DEMO_TEMPLATE),
        max_position_embeddings=DEMO_CONTEXT,
    )
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"wrote {args.out} ({size / 1e6:.1f} MB): {sorted(f.name for f in args.out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
