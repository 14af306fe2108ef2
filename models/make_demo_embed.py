"""Build the demo embedding model committed in `models/demo-embed/` (and the tiny embedding
models the tests and bench/embeddings.py use).

As `make_demo.py` does for chat, everything is made here: a WordPiece tokenizer trained on the
same generated text, a random-weight model from a config (BERT, XLM-RoBERTa, ModernBERT, or a
Qwen3-shaped decoder for last-token pooling), wrapped as a sentence-transformers model (pooling,
normalization) and saved, then exported by `tokenshop export-model --task embedding`'s own code.

    python models/make_demo_embed.py models/demo-embed

Needs the `export` extra and sentence-transformers (the dev extra); serving the result does not.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # pad is 1, as XLM-RoBERTa's
POOLING = {"bert": "mean", "xlm-roberta": "cls", "modernbert": "mean", "qwen3": "lasttoken"}
DECODERS = ("qwen3",)


def _make_demo() -> Any:
    name = "tokenshop_make_demo"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "make_demo.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def train_tokenizer(
    *, decoder: bool = False, token_types: bool = True, vocab_size: int = 2048
) -> Any:
    """A WordPiece `PreTrainedTokenizerFast`: `<s> text </s>` for encoders, `text </s>` for a
    decoder (whose last token, the one pooled, is then always `</s>`, as Qwen3-Embedding's)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    tokenizer.train_from_iterator(_make_demo().corpus(), trainer)
    single = "$A </s>" if decoder else "<s> $A </s>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single,
        special_tokens=[(token, tokenizer.token_to_id(token)) for token in ("<s>", "</s>")],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=512,
        # ModernBERT and decoders take no token_type_ids
        model_input_names=["input_ids", "token_type_ids", "attention_mask"]
        if token_types
        else ["input_ids", "attention_mask"],
    )


def build_model(arch: str, tokenizer: Any, *, seed: int = 0, **overrides: Any) -> Any:
    """A random-weight transformers base model of `arch` (no head) sized to `tokenizer`."""
    import torch
    from transformers import AutoConfig, AutoModel

    shape: dict[str, Any] = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=512,
        initializer_range=0.2,  # varied token states: vectors differ clearly between texts
    )
    if arch == "xlm-roberta":
        shape.update(max_position_embeddings=514, type_vocab_size=1)
    elif arch == "qwen3":
        shape.update(num_key_value_heads=2, head_dim=16, intermediate_size=176)
    elif arch == "modernbert":
        shape.update(global_attn_every_n_layers=2, local_attention=64)
    shape.update(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if arch == "modernbert":
        shape.update(cls_token_id=tokenizer.bos_token_id, sep_token_id=tokenizer.eos_token_id)
    shape.update(overrides)
    config = AutoConfig.for_model(arch, **shape)
    torch.manual_seed(seed)
    model = AutoModel.from_config(config)
    model.eval()
    return model


def save_sentence_transformer(
    model: Any, tokenizer: Any, out: Path, *, pooling: str, normalize: bool = True
) -> Any:
    """`model` with sentence-transformers' pooling (and normalization) saved to `out`; the
    loaded `SentenceTransformer` (torch) is returned, the reference the tests compare with."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as st

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        transformer = st.Transformer(tmp, max_seq_length=tokenizer.model_max_length)
        modules = [transformer, st.Pooling(model.config.hidden_size, pooling_mode=pooling)]
        if normalize:
            modules.append(st.Normalize())
        sentence_model = SentenceTransformer(modules=modules, device="cpu")
        sentence_model.save(str(out))
    return SentenceTransformer(str(out), device="cpu")


def make_embedding_export(
    arch: str,
    out: Path,
    *,
    source: Path | None = None,
    pooling: str | None = None,
    normalize: bool = True,
    quantize: str | None = None,
    tokenizer: Any = None,
    **overrides: Any,
) -> Any:
    """Build a tiny `arch` sentence-transformers model (saved in `source`, or a temporary dir)
    and export it to `out`; returns the torch `SentenceTransformer`."""
    from api.engine.export.embedding import export_embedding

    tokenizer = tokenizer or train_tokenizer(
        decoder=arch in DECODERS, token_types=arch in ("bert", "xlm-roberta")
    )
    model = build_model(arch, tokenizer, **overrides)
    with tempfile.TemporaryDirectory() as tmp:
        directory = source or Path(tmp)
        reference = save_sentence_transformer(
            model, tokenizer, directory, pooling=pooling or POOLING[arch], normalize=normalize
        )
        export_embedding(str(directory), out, quantize)
    return reference


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).parent / "demo-embed"
    parser.add_argument("out", type=Path, nargs="?", default=default)
    args = parser.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    sys.path.insert(0, str(ROOT))
    make_embedding_export("bert", args.out)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"wrote {args.out} ({size / 1e6:.1f} MB): {sorted(f.name for f in args.out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
