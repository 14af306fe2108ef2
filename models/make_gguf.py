"""Build a tiny random-weight llama-shaped model as a GGUF file, for llama.cpp servers in the
upstream tests and `bench/gateway.py`.

The tokenizer is the demo model's (`models/demo/tokenizer.json`, a byte-level BPE with GPT-2's
pre-tokenizer, which llama.cpp knows as "gpt-2"), and so is the chat template (ChatML, ending in
the EOS `<|im_end|>`), so Tokenshop can count a prompt exactly as the upstream does. The GGUF is
written directly with `gguf`'s GGUFWriter: with random weights there is nothing to convert.

    python models/make_gguf.py OUT.gguf [--hidden 64 --layers 2]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

DEMO = Path(__file__).resolve().parent / "demo"


def make_gguf(
    out: Path,
    *,
    tokenizer_dir: Path = DEMO,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 176,
    context: int = 2048,
    seed: int = 0,
    pooling: str | None = None,
) -> Path:
    """`pooling` ("mean", "cls", "last"): how an embedding server (`--embedding`) pools the
    tokens' states; without it llama.cpp gives a llama-shaped model none, one vector a token."""
    from gguf import GGUFWriter, PoolingType, TokenType

    from api.engine.text.tokenizer import TokenizerWrapper

    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    token_bytes = TokenizerWrapper.from_file(tokenizer_dir / "tokenizer.json").token_bytes
    special = {token["id"]: token["content"] for token in tokenizer["added_tokens"]}
    size = max([*vocab.values(), *special]) + 1
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [int(TokenType.UNUSED)] * size
    for text, index in vocab.items():
        tokens[index], types[index] = text, int(TokenType.NORMAL)
    for index, text in special.items():
        tokens[index], types[index] = text, int(TokenType.CONTROL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    template = config.get("chat_template") or (tokenizer_dir / "chat_template.jinja").read_text()
    ids = {text: index for index, text in special.items()}

    writer = GGUFWriter(str(out), "llama")
    writer.add_name("tokenshop-tiny")
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(0)  # all float32
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # llama.cpp's name for GPT-2's regex
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(ids.get(config.get("bos_token") or "", 0))
    writer.add_eos_token_id(ids[config["eos_token"]])
    writer.add_add_bos_token(False)
    writer.add_chat_template(template)
    if pooling is not None:
        writer.add_pooling_type(PoolingType[pooling.upper()])

    rng = np.random.default_rng(seed)
    head_dim = hidden // heads

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(size, hidden))
    for layer in range(layers):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"{block}.attn_q.weight", weight(hidden, hidden))
        writer.add_tensor(f"{block}.attn_k.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(f"{block}.attn_v.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(f"{block}.attn_output.weight", weight(hidden, hidden))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(ffn, hidden))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(ffn, hidden))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(hidden, ffn))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    # Rows of zeros for tokens that are not whole UTF-8 characters: their logit is 0, far below
    # the largest of thousands of random logits, so the model writes whole characters, as a
    # trained one does. A server that decodes as it streams (llama-cpp-python's) holds back the
    # rest of the answer after a stray byte, and sees a client leave only between the chunks
    # it sends.
    output = weight(size, hidden)
    output[[index for index in vocab.values() if not _whole_characters(token_bytes(index))]] = 0.0
    writer.add_tensor("output.weight", output)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _whole_characters(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--ffn", type=int, default=176)
    args = parser.parse_args()
    make_gguf(args.out, hidden=args.hidden, layers=args.layers, ffn=args.ffn)
    print(args.out)


if __name__ == "__main__":
    main()
