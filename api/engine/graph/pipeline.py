"""The load-time graph edits, in the one order they are applied, and what a served graph got.

An export stays standard on disk; when it is loaded, `edited_graph` rewrites it in memory:

1. `last_logits`: logits for the last position only.
2. `fused_attention` (ENGINE_FUSED_ATTENTION): each layer's attention becomes ONNX Runtime's
   `GroupQueryAttention` over one shared KV buffer; then `merged_projections` makes the int4
   projections that read one tensor a single call.
3. `int4_matmul` (our ops library): int4 projections on our `Int4MatMul`, then `swiglu` folds
   a SwiGLU MLP's activation into it.
4. `int8_matmul` (our ops library): dynamically quantized int8 projections on our
   `Int8MatMul`, every one on CPUs where it is faster, and an int4 export's int8 LM head on
   every CPU (`int8_matmul.py` says why); then `tied_embedding` reads a tied model's
   embedding from the int8 head's weights.
5. `attention` (our ops library, after 2): the fused attention on our `CachedAttention`, over a
   float16 cache where ENGINE_KV_CACHE_DTYPE asks (`auto`: for quantized exports).

ENGINE_INT4_KERNEL=0 keeps every node on ONNX Runtime's kernels (3-5 off).

The names of the edits applied are written into the graph's metadata (`EDITS_KEY`), which ONNX
Runtime keeps in the optimized graph it caches, so a server reports them on every start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from api.engine.graph.attention import use_attention_kernel, use_half_cache
from api.engine.graph.fused_attention import fuse_attention
from api.engine.graph.int4_matmul import use_int4_kernel
from api.engine.graph.int8_matmul import use_int8_kernel
from api.engine.graph.last_logits import EDIT_TAG, slice_last_position
from api.engine.graph.merged_projections import merge_projections
from api.engine.graph.swiglu import fold_swiglu
from api.engine.graph.tied_embedding import share_tied_embedding
from api.engine.protocol import KvCacheDtype

if TYPE_CHECKING:
    import onnx

# Part of the optimized-graph cache key: bump on any change of the fused edits.
FUSED_TAG = "gqa-rope-v4+merged-int4"
INT4_KERNEL_TAG = "int4-kernel-v5+swiglu+residual"
INT8_KERNEL_TAG = "int8-kernel-v2+residual+tied-embedding"
INT8_HEAD_TAG = "int8-head"  # an int4 export's head alone on our op (INT8_KERNEL_TAG's edits)
ATTENTION_KERNEL_TAG = "attention-kernel-v2"  # v2: left padding, and the metadata saying so
KV_CACHE_TAG = "kv-cache"  # + the asked type, where it is not float32
REPORT_TAG = "serving-path"  # the metadata `edits_of` reads
EDITS_KEY = "tokenshop.graph_edits"  # metadata: the edits applied, comma-separated, in order
WEIGHTS_KEY = "tokenshop.weights"  # metadata: int4, int8 or float, as exported
# metadata: "1" where ONNX Runtime's dynamic int8 quantization is left, whose activation scale
# spans every row and position of a call: a row's logits then depend on what shares its call
SHARED_SCALES_KEY = "tokenshop.shared_scales"

# The edits that put a node on our ops library.
OUR_OP_EDITS = ("int4-matmul", "int8-matmul", "tied-embedding", "attention")


@dataclass(frozen=True)
class EditPlan:
    """Which edits to try: each applies only where the graph has what it rewrites."""

    fuse: bool
    int4_kernel: bool  # int4 projections, and an int4 export's int8 LM head with them
    int8_kernel: bool  # every dynamically quantized int8 projection
    attention_kernel: bool
    kv_cache_dtype: KvCacheDtype = "float32"

    def cache_tag(self) -> str:
        """The optimized-graph cache key's part for this plan."""
        tag = f"{EDIT_TAG}+{REPORT_TAG}"
        tag += f"+{FUSED_TAG}" if self.fuse else ""
        tag += f"+{INT4_KERNEL_TAG}" if self.int4_kernel else ""
        tag += f"+{INT8_KERNEL_TAG}" if self.int8_kernel else ""
        tag += f"+{INT8_HEAD_TAG}" if self.int4_kernel and not self.int8_kernel else ""
        own_attention = self.fuse and self.attention_kernel
        tag += f"+{ATTENTION_KERNEL_TAG}" if own_attention else ""
        if own_attention and self.kv_cache_dtype != "float32":
            tag += f"+{KV_CACHE_TAG}-{self.kv_cache_dtype}"
        return tag


def can_edit() -> bool:
    """Whether the `onnx` package, which every edit needs, imports here."""
    try:
        import onnx  # noqa: F401 - a runtime dependency; a broken install may lack it
    except ImportError:
        return False
    return True


def edited_graph(model_file: Path, config: dict[str, Any], plan: EditPlan) -> str | bytes:
    """The graph for ONNX Runtime with every edit of `plan` that applies, in the order above,
    and their names in its metadata; the file's path where none applies."""
    import onnx

    try:
        proto = onnx.load(str(model_file), load_external_data=False)
    except Exception:  # noqa: BLE001 - not a readable graph: ONNX Runtime names the fault later
        return str(model_file)
    weights = weights_of(proto)
    applied: list[str] = []
    if slice_last_position(proto):
        applied.append("last-logits")
    fused = plan.fuse and fuse_attention(proto, config)
    if fused:
        applied.append("fused-attention")
        if merge_projections(proto):
            applied.append("merged-projections")
    if plan.int4_kernel and use_int4_kernel(proto) > 0:
        applied.append("int4-matmul")
        if fold_swiglu(proto):
            applied.append("swiglu")
    int8 = plan.int8_kernel or (plan.int4_kernel and weights == "int4")  # int4: the head alone
    if int8 and use_int8_kernel(proto) > 0:
        applied.append("int8-matmul")
        if share_tied_embedding(proto, model_file.parent):
            applied.append("tied-embedding")
    if fused and plan.attention_kernel and use_attention_kernel(proto) > 0:
        applied.append("attention")
        quantized = weights != "float"  # int4 or int8: the edits only change whose op runs them
        wants_half = plan.kv_cache_dtype == "float16"
        if (wants_half or (plan.kv_cache_dtype == "auto" and quantized)) and use_half_cache(proto):
            applied.append("half-cache")
    if not applied:
        return str(model_file)
    props = {p.key: p.value for p in proto.metadata_props}
    shared = any(node.op_type == "DynamicQuantizeLinear" for node in proto.graph.node)
    onnx.helper.set_model_props(
        proto,
        {
            **props,
            EDITS_KEY: ",".join(applied),
            WEIGHTS_KEY: weights,
            SHARED_SCALES_KEY: "1" if shared else "0",
        },
    )
    return proto.SerializeToString()


def weights_of(proto: onnx.ModelProto) -> str:
    """What the export's projections are: int4 (`MatMulNBits`), int8 (dynamic quantization) or
    float (an int4 or int8 graph takes a float16 KV cache under ENGINE_KV_CACHE_DTYPE=auto)."""
    ops = {node.op_type for node in proto.graph.node}
    if ops & {"MatMulNBits", "Int4MatMul"}:
        return "int4"
    if ops & {"MatMulInteger", "Int8MatMul"}:
        return "int8"
    return "float"


def scales_shared(metadata: dict[str, str]) -> bool:
    """Whether a session's graph quantizes activations with one scale per call (ONNX Runtime's
    dynamic int8), so a row's logits depend on the rows and positions it shares a call with."""
    return metadata.get(SHARED_SCALES_KEY, "1") != "0"


def edits_of(metadata: dict[str, str]) -> tuple[tuple[str, ...], str]:
    """The edits a session's graph got and its weights, from its custom metadata (a graph
    served as exported has none: its weights are then "unknown")."""
    edits = tuple(name for name in metadata.get(EDITS_KEY, "").split(",") if name)
    return edits, metadata.get(WEIGHTS_KEY, "unknown")
