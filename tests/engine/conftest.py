"""Engine fixtures: the committed demo model, and tiny models exported by optimum-onnx.

Exports are made once per test session (a few seconds each) under pytest's session temp dir, from
the same builders that make `models/demo/` (`models/make_demo.py`), so every architecture the
exactness tests cover is produced by the real Optimum exporter, never by hand.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from api.engine.export.quantize import Int4Config, quantize_int4, quantize_int8
from api.engine.local_engine import LocalEngine
from api.engine.model import causal_lm as engine_model
from api.engine.model.session_cache import MODEL_FILE
from api.engine.ops.library import default_library, runs_here
from api.engine.protocol import GenerationOutput, GenerationRequest, KvCacheDtype, SamplingParams
from api.engine.runtime.scheduler import SchedulerLimits
from api.engine.runtime.sequence import Sequence

ROOT = Path(__file__).resolve().parents[2]
DEMO_DIR = ROOT / "models" / "demo"


def load_make_demo() -> ModuleType:
    """`models/make_demo.py` is a script, not a package module: load it by path."""
    name = "tokenshop_make_demo"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "models" / "make_demo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# Fixtures that export a model with optimum-onnx (seconds each): the tests that use them, directly
# or through another fixture, are slow, left out of `make test-fast` and run by `make test`.
EXPORTING_FIXTURES = {"tiny_exports", "tied_export", "int4_export"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if EXPORTING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


class TinyExport:
    """A tiny model exported to ONNX, with its PyTorch original for comparisons."""

    def __init__(self, arch: str, path: Path, model: Any, tokenizer: Any) -> None:
        self.arch = arch
        self.path = path
        self.model = model
        self.tokenizer = tokenizer


@pytest.fixture(scope="session")
def tiny_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyExport]:
    """Lazily exported tiny models, one per architecture, shared by the whole session."""
    return _ExportCache(tmp_path_factory)


class _ExportCache(dict):
    def __init__(self, factory: pytest.TempPathFactory) -> None:
        super().__init__()
        self._factory = factory
        self._tokenizer: Any = None

    def __missing__(self, arch: str) -> TinyExport:
        make_demo = load_make_demo()
        if self._tokenizer is None:
            self._tokenizer = make_demo.train_tokenizer()
        out = self._factory.mktemp(f"export-{arch}")
        # A large init std makes next-token distributions peaked (top-2 logit gaps of 0.01-1),
        # so greedy comparisons are not decided by float rounding between PyTorch and ORT.
        model, tokenizer = make_demo.make_export(
            arch, out, tokenizer=self._tokenizer, initializer_range=1.0
        )
        self[arch] = TinyExport(arch, out, model, tokenizer)
        return self[arch]


@pytest.fixture(scope="session")
def tied_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    make_demo = load_make_demo()
    out = tmp_path_factory.mktemp("tied-qwen2")
    make_demo.make_export(
        "qwen2",
        out,
        tie_word_embeddings=True,
        hidden_size=128,
        head_dim=32,
        intermediate_size=384,
        # The usual init std of trained models' configs. A larger one (the exactness tests use
        # 1.0 for peaked logits) makes a random network chaotic: every small perturbation is
        # amplified layer by layer, so any quantization would look like noise.
        initializer_range=0.02,
    )
    return out


@pytest.fixture(scope="session")
def library() -> Path:
    """Our int4/int8 op library. A machine that cannot build it (no compiler, no header) skips
    the tests that need it, unless TOKENSHOP_REQUIRE_OPS is set, as CI sets it."""
    path = default_library()
    if not runs_here(path):
        reason = f"{path} is not built for this machine (python -m api.engine.ops.build)"
        if os.environ.get("TOKENSHOP_REQUIRE_OPS", "") not in ("", "0"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture
def served_with_our_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine serves int8 projections with our op on any CPU, not only where it is chosen
    (AVX-512 VNNI): its AVX2 path is served the same way, and checked the same way."""
    monkeypatch.setattr(engine_model, "int8_kernel_runs_faster", lambda library: True)


@pytest.fixture(params=["default", "vnni", "avx2"])
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The op's instruction set: the CPU's best (AMX tiles where it has them, else AVX-512
    VNNI), or a lesser one forced, so that an AMX machine checks all three paths. A set the CPU
    lacks falls back to the best it has."""
    if request.param == "default":
        monkeypatch.delenv("TOKENSHOP_INT4_ISA", raising=False)
    else:
        monkeypatch.setenv("TOKENSHOP_INT4_ISA", str(request.param))
    return str(request.param)


def activation_batches(k: int) -> Iterator[np.ndarray]:
    """Inputs [rows, k] for our ops: 1 to 70 rows (decode steps of 1 to 8 sequences, every
    remainder of a tile, one and two AMX tiles of rows as drafts are verified, a prefill chunk),
    each with an outlier in the first block, whose scale must be that block's own, not the
    row's."""
    rng = np.random.default_rng(7)
    for rows in (1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 24, 32, 33, 70):
        a = rng.standard_normal((rows, k)).astype(np.float32)
        a[0, 0] = 40.0
        yield a


def projection_session(
    nodes: list[onnx.NodeProto],
    initializers: list[onnx.TensorProto],
    shape: tuple[int, int, int],
    *,
    library: Path | None,
    edit: Any,
    bias: np.ndarray | None = None,
) -> ort.InferenceSession:
    """A graph of one projection from input `x` [.., K] to `Y` [.., N] (`shape`: rank, K, N),
    written by `nodes` ending in `Y`, with a bias `Add` behind it if given; run by ONNX
    Runtime's kernels, or with `library`, after `edit` (a graph edit of ours) moved the
    projection onto our op."""
    rank, k, n = shape
    nodes, initializers = list(nodes), list(initializers)
    if bias is not None:
        nodes[-1].output[0] = "product"
        nodes.append(helper.make_node("Add", ["product", "bias"], ["Y"]))
        initializers.append(numpy_helper.from_array(bias, "bias"))
    leading = ["d0", "d1"][: rank - 1]
    graph = helper.make_graph(
        nodes,
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*leading, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [*leading, n])],
        initializers,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    if library is not None:
        assert edit(model) == 1
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def served_ops(export: Path, library: Path, cache: Path) -> list[onnx.NodeProto]:
    """The nodes of the graph the engine serves `export` with, on our op library (read from
    ONNX Runtime's optimized-graph cache in `cache`)."""
    make_engine(export, cache_dir=cache, ops_library=library)
    (cached,) = cache.glob(f"*/{MODEL_FILE}")
    return list(onnx.load(str(cached), load_external_data=False).graph.node)


@pytest.fixture(scope="module")
def int4_export(tied_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantized_copy(tied_export, tmp_path_factory.mktemp("int4") / "model", "int4")


def quantized_copy(source: Path, dest: Path, method: str) -> Path:
    shutil.copytree(source, dest)
    if method == "int8":
        quantize_int8(dest)
    else:
        quantize_int4(dest, Int4Config())
    return dest


def make_engine(
    path: Path,
    *,
    cache_dir: Path | None = None,
    fused_attention: bool = True,
    ops_library: Path | None = None,
    kv_cache_dtype: KvCacheDtype = "float32",
    **limits: Any,
) -> LocalEngine:
    return LocalEngine(
        path.name,
        path,
        limits=SchedulerLimits(**limits),
        threads=1,
        cache_dir=cache_dir,
        fused_attention=fused_attention,
        ops_library=ops_library,
        kv_cache_dtype=kv_cache_dtype,
    )


@pytest.fixture
async def demo_engine() -> AsyncIterator[LocalEngine]:
    engine = make_engine(DEMO_DIR)
    await engine.start()
    yield engine
    await engine.shutdown()


async def collect(engine: LocalEngine, request: GenerationRequest) -> list[GenerationOutput]:
    return [out async for out in engine.generate(request)]


def token_ids(outputs: list[GenerationOutput]) -> list[int]:
    """All the tokens a request got, over its outputs."""
    return [t for o in outputs for t in o.token_ids]


def greedy(request_id: str, prompt: list[int], max_tokens: int, **params: Any) -> GenerationRequest:
    return GenerationRequest(
        request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, **params)
    )


class ImmediateLoop:
    """Stands in for an event loop when a test drives `Scheduler.step()` itself."""

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> None:
        callback(*args)


class ListQueue(list):
    """Collects a sequence's deliveries in order."""

    def put_nowait(self, item: Any) -> None:
        self.append(item)


def manual_sequence(engine: LocalEngine, request: GenerationRequest) -> Sequence:
    """A sequence as `LocalEngine.generate` makes it, for a scheduler stepped by hand."""
    constraint = request.params.constraint
    return Sequence(
        request=request,
        tokenizer=engine.tokenizer,
        eos_token_ids=engine.model.eos_token_ids,
        context_length=engine.context_length,
        loop=ImmediateLoop(),  # type: ignore[arg-type]
        queue=ListQueue(),  # type: ignore[arg-type]
        matcher=engine.grammars.matcher(constraint) if constraint else None,
    )


def run_steps(
    engine: LocalEngine,
    joins: dict[int, list[GenerationRequest]],
    prepare: Callable[[Sequence], None] | None = None,
) -> tuple[dict[str, list[GenerationOutput]], int]:
    """Step the scheduler by hand; requests of `joins[k]` are queued before step k, each
    sequence given to `prepare` first.

    Returns each request's outputs and the largest batch a decode step ran.
    """
    sequences: dict[str, Sequence] = {}
    step = largest = 0
    last_join = max(joins)
    while step <= last_join or any(not s.finished for s in sequences.values()):
        for request in joins.get(step, []):
            sequences[request.request_id] = manual_sequence(engine, request)
            if prepare is not None:
                prepare(sequences[request.request_id])
            engine.scheduler.submit(sequences[request.request_id])
        engine.scheduler.step()
        largest = max(largest, engine.scheduler.last_batch_size)
        step += 1
    return {rid: list(s.queue) for rid, s in sequences.items()}, largest  # type: ignore[arg-type]
