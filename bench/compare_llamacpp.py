"""llama.cpp for `bench/compare.py`: the GGUF conversion, its quantizations, and a worker.

    bench/out/llamacpp-venv/bin/python bench/compare_llamacpp.py convert SRC_DIR OUT.gguf
    bench/out/llamacpp-venv/bin/python bench/compare_llamacpp.py quantize IN.gguf OUT.gguf q4_0
    bench/out/llamacpp-venv/bin/python bench/compare_llamacpp.py serve MODEL.gguf --threads 2 ...

Runs in the venv of llama-cpp-python (compiled from its sdist for this host's CPU when
`compare.py` makes the venv) and the `gguf` package, so it imports nothing from this project.

- `convert` writes the transformers dir that our exports and genai's are made from as a float32
  GGUF with the `gguf` package, tensor by tensor: renamed by its own Qwen2 or Llama name map
  (Qwen2 as is: llama.cpp ropes it in the NeoX layout, as transformers does; Llama's q/k rows
  reordered and Llama 3's rope scaling written as `rope_freqs`, as llama.cpp's converter does),
  the BPE vocabulary and merges of `tokenizer.json` padded to the config's vocabulary size.
- `quantize` is llama.cpp's quantizer (`llama_model_quantize`), with its per-tensor rules: the
  tied embedding/head becomes q6_K under q4_0 and q4_K_M, and q4_K_M falls back to q5_0/q8_0 for
  rows of 896 (not a multiple of 256), as it does on the real Qwen2.5-0.5B (1,536 and 3,072
  are multiples of 256: the larger shapes keep q4_K/q6_K throughout).
- `serve` loads one GGUF and answers one JSON command per stdin line with one `@@`-prefixed JSON
  line on stdout, like the other workers. llama-cpp-python's own server serves one request at a
  time, so concurrent streams run here as llama-server runs its parallel slots: one context with
  a sequence per stream (`n_seq_max`), every stream's next token in one `llama_decode` batch, and
  a prompt that arrives while others decode goes into the same batch as their next tokens.
  Greedy (argmax of the logits), no stop at the end token, so every stream makes the tokens asked.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

FTYPES = {"q8_0": 7, "q4_0": 2, "q4_K_M": 15}  # llama_ftype: LLAMA_FTYPE_MOSTLY_*


# --- conversion ---------------------------------------------------------------------------------


ARCHES = {"qwen2": "QWEN2", "llama": "LLAMA"}  # config model_type -> gguf.MODEL_ARCH


def convert(src: Path, out: Path) -> None:
    import gguf
    from safetensors import safe_open

    config = json.loads((src / "config.json").read_text())
    if config["model_type"] not in ARCHES:
        raise SystemExit(f"convert: only {sorted(ARCHES)} dirs, not {config['model_type']}")
    arch = getattr(gguf.MODEL_ARCH, ARCHES[config["model_type"]])
    blocks = config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    names = gguf.get_tensor_name_map(arch, blocks)
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(src.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    llama = config["model_type"] == "llama"
    if llama:
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim)
    _add_vocabulary(writer, src, config["vocab_size"], "llama-bpe" if llama else "qwen2")
    # Two passes, as llama.cpp's own converter writes a large model: every tensor's name and
    # shape first, then the data one tensor at a time, so a 3B model's 12.8 GB of fp32 is never
    # in memory at once.
    plan: list[tuple[str, Path, str, tuple[int, ...]]] = []  # gguf name, file, hf name, shape
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(file, framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name == "lm_head.weight" and config.get("tie_word_embeddings"):
                    continue
                mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
                if mapped is None:
                    raise SystemExit(f"convert: no GGUF name for {name}")
                plan.append((mapped, file, name, tuple(f.get_slice(name).get_shape())))
    factors = _llama3_rope_factors(config, head_dim) if llama else None
    for mapped, _, _, shape in plan:
        writer.add_tensor_info(mapped, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    if factors is not None:
        rope = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"
        writer.add_tensor_info(rope, factors.shape, factors.dtype, factors.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, file, name, _ in plan:
        with safe_open(file, framework="numpy") as f:
            tensor = np.ascontiguousarray(f.get_tensor(name), dtype=np.float32)
        if llama and name.endswith("self_attn.q_proj.weight"):
            tensor = _permute(tensor, heads, heads)
        elif llama and name.endswith("self_attn.k_proj.weight"):
            tensor = _permute(tensor, heads, kv_heads)
        writer.write_tensor_data(tensor)
        del tensor
    if factors is not None:
        writer.write_tensor_data(factors)
    writer.close()


def _permute(weights: np.ndarray, heads: int, kv_heads: int) -> np.ndarray:
    """llama.cpp's converter's reordering of Llama's q/k rows: transformers ropes the halves of
    each head (NeoX layout), llama.cpp's `llama` arch ropes adjacent pairs."""
    if kv_heads != heads:
        heads = kv_heads
    shape = weights.shape
    return np.ascontiguousarray(
        weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    )


def _llama3_rope_factors(config: dict[str, Any], head_dim: int) -> np.ndarray | None:
    """Llama 3's rope scaling as llama.cpp's converter writes it: a `rope_freqs` tensor of one
    factor per frequency (1 for short wavelengths, `factor` for long, smoothed between)."""
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    freqs = 1.0 / (config["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor = scaling.get("factor", 8.0)
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old = scaling.get("original_max_position_embeddings", 8192)
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _add_vocabulary(writer: Any, src: Path, size: int, pre: str) -> None:
    """The byte-level BPE of `tokenizer.json`, as llama.cpp's `gpt2` tokenizer model reads it."""
    import gguf

    spec = json.loads((src / "tokenizer.json").read_text())
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    special = {t["id"]: t["content"] for t in spec.get("added_tokens", [])}
    by_id = {i: token for token, i in vocab.items()} | special
    tokens, types = [], []
    for i in range(size):
        if i in special:
            tokens.append(special[i])
            types.append(gguf.TokenType.CONTROL)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    settings = json.loads((src / "tokenizer_config.json").read_text())
    ids = {token: i for i, token in special.items()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (
        ("bos_token", writer.add_bos_token_id),
        ("eos_token", writer.add_eos_token_id),
        ("pad_token", writer.add_pad_token_id),
    ):
        if settings.get(key) in ids:
            add(ids[settings[key]])
    writer.add_add_bos_token(False)


def quantize(source: Path, out: Path, kind: str, threads: int) -> None:
    import llama_cpp as ll

    params = ll.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.nthread = threads
    if ll.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params)):
        raise SystemExit(f"quantize: llama_model_quantize failed for {kind}")


def bytes_per_token(path: Path) -> int:
    """Weight bytes one decode step reads: every tensor in full, except the embedding table when
    a separate output head exists (then one row of it is gathered)."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    total = 0
    for name, tensor in tensors.items():
        if name == "token_embd.weight" and "output.weight" in tensors:
            total += int(tensor.n_bytes) // int(tensor.shape[-1])  # ggml order: rows last
        else:
            total += int(tensor.n_bytes)
    return total


# --- the worker ---------------------------------------------------------------------------------


class Engine:
    """One llama.cpp context with a KV sequence per concurrent stream."""

    def __init__(
        self,
        path: Path,
        threads: int,
        seqs: int,
        seq_ctx: int,
        flash: str,
        unified: bool = False,
        extra_bufts: bool = True,
    ) -> None:
        import llama_cpp as ll

        self.ll = ll
        ll.llama_backend_init()
        quiet = ll.llama_log_callback(lambda level, text, data: None)
        self._quiet = quiet  # kept alive: llama.cpp calls it
        if not os.environ.get("LLAMACPP_LOG"):
            ll.llama_log_set(quiet, ctypes.c_void_p(0))
        model_params = ll.llama_model_default_params()
        # llama.cpp's extra weight buffers (AMX tiles, repacked q4_0/q8_0 rows): its default;
        # off is llama-server's --no-repack (see compare.py's --llamacpp-extra-bufts).
        model_params.use_extra_bufts = extra_bufts
        self.model = ll.llama_model_load_from_file(str(path).encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        params = ll.llama_context_default_params()
        params.n_seq_max = seqs
        params.n_ctx = seqs * seq_ctx  # split evenly between the sequences unless unified
        params.n_batch = max(2048, seq_ctx + seqs)  # a long prompt joins running streams whole
        params.n_ubatch = 512
        params.n_threads = threads
        params.n_threads_batch = threads
        params.flash_attn_type = {"on": 1, "off": 0, "auto": -1}[flash]
        params.kv_unified = unified  # off by default; llama-server's default with auto slots
        params.no_perf = True
        self.ctx = ll.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not make the context")
        self.n_batch = params.n_batch
        self.seqs = seqs
        self.batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self.settings = {
            "threads": threads,
            "threads_batch": threads,
            "flash_attn": flash,
            "n_seq_max": seqs,
            "n_ctx": params.n_ctx,
            "n_batch": params.n_batch,
            "n_ubatch": params.n_ubatch,
            "kv_unified": unified,
            "type_k": {0: "f32", 1: "f16"}.get(params.type_k, params.type_k),
            "type_v": {0: "f32", 1: "f16"}.get(params.type_v, params.type_v),
            "load_mode": getattr(model_params, "load_mode", "default"),
            "use_extra_bufts": extra_bufts,
        }

    def clear(self) -> None:
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> list[int]:
        """One llama_decode of (token, position, sequence, wants logits) entries; the argmax
        of each entry that wanted logits, in order."""
        batch = self.batch
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits
        batch.n_tokens = len(entries)
        status = self.ll.llama_decode(self.ctx, batch)
        if status:
            raise RuntimeError(f"llama_decode returned {status}")
        picks = []
        for i, (*_, logits) in enumerate(entries):
            if logits:
                row = self.ll.llama_get_logits_ith(self.ctx, i)
                picks.append(int(np.ctypeslib.as_array(row, shape=(self.n_vocab,)).argmax()))
        return picks

    def prefill(self, prompts: list[list[int]], first_seq: int = 0) -> list[int]:
        entries = [
            (token, pos, first_seq + s, pos == len(ids) - 1)
            for s, ids in enumerate(prompts)
            for pos, token in enumerate(ids)
        ]
        return self.decode(entries)

    def generate(self, prompts: list[list[int]], tokens: int) -> dict[str, Any]:
        """Every prompt in its own sequence, prefilled together, then `tokens` greedy tokens
        each, all streams in one batch per step (as llama-server's slots)."""
        self.clear()
        started = time.perf_counter()
        last = self.prefill(prompts)
        first = time.perf_counter()
        lengths = [len(ids) for ids in prompts]
        for step in range(1, tokens):
            last = self.decode([(t, lengths[s] + step - 1, s, True) for s, t in enumerate(last)])
        end = time.perf_counter()
        per = (tokens - 1) / (end - first) if tokens > 1 else 0.0
        return {"ttft": first - started, "per": per, "agg": len(prompts) * tokens / (end - started)}

    def ttft_running(self, running: list[list[int]], long: list[int]) -> dict[str, Any]:
        """Time to first token of `long` arriving while `running` streams decode: its prompt
        goes into the next step's batch beside their tokens, as llama-server batches a new
        slot's prompt with the running slots' next tokens (n_batch holds it whole)."""
        self.clear()
        last = self.prefill(running) if running else []
        lengths = [len(ids) for ids in running]
        for step in range(1, 3) if running else ():  # streams past their first tokens
            last = self.decode([(t, lengths[s] + step - 1, s, True) for s, t in enumerate(last)])
        submitted = time.perf_counter()
        entries = [(t, lengths[s] + 2, s, True) for s, t in enumerate(last)]
        entries += [(tok, pos, len(running), pos == len(long) - 1) for pos, tok in enumerate(long)]
        self.decode(entries)
        return {"ttft": time.perf_counter() - submitted}


def serve(args: argparse.Namespace) -> int:
    import llama_cpp as ll

    engine = Engine(
        args.model,
        args.threads,
        args.seqs,
        args.seq_ctx,
        args.flash,
        args.kv_unified,
        extra_bufts=args.extra_bufts == "on",
    )
    hello = {
        "ready": True,
        "version": ll.__version__,
        "system_info": ll.llama_print_system_info().decode().strip(),
        "bytes_per_token": bytes_per_token(args.model),
        "settings": engine.settings,
    }
    print("@@" + json.dumps(hello), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if command["op"] == "generate":
                reply = engine.generate(command["ids"], command["tokens"])
            elif command["op"] == "ttft_running":
                reply = engine.ttft_running(command["running"], command["ids"])
            else:
                raise ValueError(f"unknown op {command['op']!r}")
        except Exception as exc:  # reported to the orchestrator, which decides
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print("@@" + json.dumps(reply), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("convert")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p = sub.add_parser("quantize")
    p.add_argument("source", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("kind", choices=sorted(FTYPES))
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p = sub.add_parser("serve")
    p.add_argument("model", type=Path)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--seqs", type=int, default=17)
    p.add_argument("--seq-ctx", type=int, default=1024)
    p.add_argument("--flash", choices=("on", "off", "auto"), default="on")
    p.add_argument("--kv-unified", action="store_true", help="one KV buffer for all sequences")
    p.add_argument("--extra-bufts", choices=("on", "off"), default="on", help="AMX/repack buffers")
    args = parser.parse_args()
    if args.command == "convert":
        convert(args.src, args.out)
    elif args.command == "quantize":
        quantize(args.source, args.out, args.kind, args.threads)
    else:
        return serve(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
