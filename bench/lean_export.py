"""Our export of a model too large for optimum's export here, with about one layer in memory.

    .venv/bin/python bench/lean_export.py SRC_DIR OUT_DIR [--quantize int8|int4]

optimum's export (`tokenshop export-model`) holds about 2.8x the fp32 weights at its peak (5.5 GB
for the 0.5B shape): a 3B model's 12.8 GB would need ~36 GB, and this host has 24 GiB. This
script writes the same graph the same way, a layer at a time, for `bench/compare.py --shape
llama-3.2-3b` (its 1.5B export can be checked against optimum's own with `--check`):

1. a stub: SRC's config with 2 layers, holding SRC's own embedding, layers 0 and 1 and final
   norm (a transformers dir of ~2.4 GB for the 3B shape);
2. the stub exported by `tokenshop export-model` itself (optimum's graph, `quantize_int8` /
   `quantize_int4`), in fp32 and in the precision asked for; a stub over 1.9 GB (the 3B
   shape's: its 1.58 GB embedding) the same way but for optimum's post-processing, which
   fails past protobuf's 2 GB (see `untied_stub`);
3. the stub grown to SRC's layer count: layer 1's nodes cloned for layers 2..N-1 (names
   renumbered, `past_key_values.K.*` / `present.K.*` added, the residual chained, the final norm
   reading the last layer), each clone's weights read from SRC one layer at a time, put in the
   form the stub's layer 1 has them (as is or transposed: found by value against SRC's layer 1)
   and quantized by the same `quantize_int8` / `quantize_int4` on a graph of that layer's
   MatMuls alone. Layer 1 goes through that same path first and must match the stub's own
   layer 1 byte for byte, or the script stops;
4. every initializer over 1 KB written to `model.onnx_data`, streamed; then, as `export-model`
   ends, the engine loads the export and generates a few tokens.

Prints the peak RSS of each step (the stub's exports run in processes of their own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STUB_LAYERS = 2
TIED_LIMIT = 1_900_000_000  # a stub above this goes through `untied_stub` (protobuf's 2 GB)
INLINE_BYTES = 1024  # smaller initializers stay in model.onnx, as onnx's own save keeps them
MODEL_FILE, DATA_FILE = "model.onnx", "model.onnx_data"


def say(message: str) -> None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"[{time.strftime('%H:%M:%S')} peak RSS {peak:.0f} MB] {message}", flush=True)


def source_tensors(src: Path) -> dict[str, Path]:
    """SRC's tensor names, each with the safetensors file holding it."""
    index = src / "model.safetensors.index.json"
    if index.exists():
        return {k: src / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    return {name: src / "model.safetensors" for name in _keys(src / "model.safetensors")}


def _keys(file: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(file, framework="numpy") as f:
        return list(f.keys())  # noqa: SIM118 - safe_open is not a mapping


def read(files: dict[str, Path], name: str) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(files[name], framework="numpy") as f:
        return np.ascontiguousarray(f.get_tensor(name), dtype=np.float32)


def make_stub(src: Path, stub: Path) -> None:
    """SRC cut to its first STUB_LAYERS layers (its own tensors), as a transformers dir."""
    from safetensors.numpy import save_file

    files = source_tensors(src)
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = STUB_LAYERS
    if "layer_types" in config:  # Qwen2's per-layer attention kinds (all full here)
        config["layer_types"] = config["layer_types"][:STUB_LAYERS]
    stub.mkdir(parents=True)
    (stub / "config.json").write_text(json.dumps(config, indent=1))
    keep = {
        name: read(files, name)
        for name in files
        if not name.startswith("model.layers.")
        or int(name.split(".")[2]) < STUB_LAYERS  # model.layers.<i>.…
    }
    save_file(keep, str(stub / "model.safetensors"), metadata={"format": "pt"})
    for file in src.iterdir():
        if file.suffix in (".json", ".jinja") and file.name not in (
            "config.json",
            "model.safetensors.index.json",
        ):
            shutil.copy2(file, stub / file.name)


def export_stub(stub: Path, out: Path, quantize: str | None) -> None:
    """The stub through our own export, `tokenshop export-model` (optimum's graph, our
    quantizers, the engine's check at the end), in a process of its own: the export and the
    quantizers hold several times the stub's weights, which this process then does not keep."""
    tokenshop = Path(sys.executable).parent / "tokenshop"
    argv = [str(tokenshop), "export-model", str(stub), str(out)]
    if stub_bytes(stub) > TIED_LIMIT:
        argv = [sys.executable, __file__, "untied-stub", str(stub), str(out)]
    argv += ["--quantize", quantize] if quantize else []
    say("$ " + " ".join(argv))
    proc = subprocess.Popen(argv)
    _, status, usage = os.wait4(proc.pid, 0)
    say(f"stub export: peak RSS {usage.ru_maxrss / 1024:.0f} MB")
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"lean export: the stub's export failed ({status})")


def stub_bytes(stub: Path) -> int:
    return sum(f.stat().st_size for f in stub.glob("*.safetensors"))


def untied_stub(stub: Path, out: Path, quantize: str | None) -> None:
    """What `tokenshop export-model` does (api/engine/export/exporter.py), but for optimum's
    post-processing, which fails on a graph over 2 GB: it ties the head back to the embedding,
    then calls `ModelProto.ByteSize()`, which raises past protobuf's 2 GB (the 3B shape's stub,
    2.4 GB). Without it the head keeps its own transposed copy of the embedding, which is what
    our quantizers' `untie_head` makes anyway, so the quantized graphs differ only in that
    initializer's name; the fp32 graph reads that copy instead of a Transpose of the embedding."""
    import warnings

    from optimum.exporters.onnx import main_export

    from api.engine.export.exporter import SIDE_FILES
    from api.engine.export.quantize import quantize_int4, quantize_int8

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main_export(
            str(stub),
            out,
            task="text-generation-with-past",
            do_validation=False,
            no_post_process=True,
        )
    for name in SIDE_FILES:
        if (stub / name).is_file() and not (out / name).exists():
            shutil.copy2(stub / name, out / name)
    if quantize:
        (quantize_int8 if quantize == "int8" else quantize_int4)(out)


# --- the graph ------------------------------------------------------------------------------------


def in_layer(name: str, layer: int) -> bool:
    return f"/layers.{layer}/" in name


def renumber(name: str, layer: int) -> str:
    """Layer 1's name of a node or tensor as layer `layer`'s; a name that does not say its layer
    (an initializer such as `onnx::MatMul_123_Q4`) gets the layer as a suffix."""
    out = (
        name.replace("layers.1/", f"layers.{layer}/")
        .replace("layers.1.", f"layers.{layer}.")
        .replace("past_key_values.1.", f"past_key_values.{layer}.")
        .replace("present.1.", f"present.{layer}.")
    )
    return out if out != name else f"{name}.layer{layer}"


def weight_forms(
    model: Any, files: dict[str, Path]
) -> tuple[dict[str, tuple[str, bool]], list[str]]:
    """Each initializer of layer 1's own that holds one of SRC's layer-1 parameters: (the
    parameter's name after `model.layers.1.`, whether it is stored transposed), found by value
    (between equal values, by the module its consumer is named after); and the parameters held
    by no initializer of layer 1's own (the exporter shares one initializer among equal ones,
    such as unit norms: a clone may share it only where its layer's values are equal too)."""
    from onnx import numpy_helper

    layer1 = {n: read(files, n) for n in files if n.startswith("model.layers.1.")}
    forms: dict[str, tuple[str, bool]] = {}
    owned = layer_consumed(model, 1)
    readers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.name)
    for tensor in model.graph.initializer:
        if tensor.name not in owned:
            continue
        value = numpy_helper.to_array(tensor)
        matches = []
        for name, param in layer1.items():
            if value.size != param.size or value.dtype != np.float32:
                continue
            suffix = name.removeprefix("model.layers.1.")
            if value.shape == param.shape and np.array_equal(value, param):
                matches.append((suffix, False))
            elif value.shape == param.T.shape and np.array_equal(value, param.T):
                matches.append((suffix, True))
        if len(matches) > 1:
            module = [
                m
                for m in matches
                if any(
                    "/" + m[0].rsplit(".", 1)[0].replace(".", "/") + "/" in r
                    for r in readers.get(tensor.name, [])
                )
            ]
            matches = module or matches[:1]
        if matches:
            forms[tensor.name] = matches[0]
    held = {f"model.layers.1.{s}" for s, _ in forms.values()}
    return forms, sorted(set(layer1) - held)


def layer_consumed(model: Any, layer: int) -> set[str]:
    """Initializers read by layer `layer`'s nodes and by no other node."""
    inits = {t.name for t in model.graph.initializer}
    inside, outside = set(), set()
    for node in model.graph.node:
        (inside if in_layer(node.name, layer) else outside).update(
            name for name in node.input if name in inits
        )
    return inside - outside


def layer_weights(
    layer: int,
    files: dict[str, Path],
    forms: tuple[dict[str, tuple[str, bool]], list[str]],
    quantize: str | None,
) -> dict[str, np.ndarray]:
    """Layer `layer`'s initializers as the stub names its layer 1's, in the stub's form: the
    fp32 tensors (transposed where the stub's are), and with `quantize` the MatMul weights
    through our own quantizer, on a graph of those MatMuls alone."""
    forms, shared = forms
    for name in shared:
        ours = read(files, name.replace("layers.1.", f"layers.{layer}.", 1))
        if not np.array_equal(ours, read(files, name)):
            raise SystemExit(f"lean export: layer {layer} cannot share layer 1's {name}")
    fp32 = {}
    for init, (suffix, transposed) in forms.items():
        value = read(files, f"model.layers.{layer}.{suffix}")
        fp32[init] = np.ascontiguousarray(value.T) if transposed else value
    if quantize is None:
        return fp32
    matmuls = {k: v for k, v in fp32.items() if v.ndim == 2}
    out = {k: v for k, v in fp32.items() if v.ndim != 2}
    out.update(quantize_alone(matmuls, quantize))
    return out


def quantize_alone(weights: dict[str, np.ndarray], quantize: str) -> dict[str, np.ndarray]:
    """`weights` (name -> [in, out]) as MatMuls of a graph of their own, quantized in place by
    `api.engine.export.quantize`; that graph's initializers afterwards."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from api.engine.export.quantize import quantize_int4, quantize_int8

    nodes, inputs, outputs = [], [], []
    for i, (name, value) in enumerate(weights.items()):
        inputs.append(
            helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, value.shape[0]])
        )
        outputs.append(
            helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, value.shape[1]])
        )
        nodes.append(helper.make_node("MatMul", [f"x{i}", name], [f"y{i}"], name=f"mm{i}"))
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    graph = helper.make_graph(nodes, "layer", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory(dir=ROOT / "bench" / "out") as tmp:
        onnx.save_model(
            model, f"{tmp}/{MODEL_FILE}", save_as_external_data=True, location=DATA_FILE
        )
        del model, inits, graph
        (quantize_int8 if quantize == "int8" else quantize_int4)(Path(tmp))
        result = onnx.load(f"{tmp}/{MODEL_FILE}", load_external_data=True)
        return {t.name: numpy_helper.to_array(t) for t in result.graph.initializer}


def check_layer1(model: Any, ours: dict[str, np.ndarray]) -> None:
    """Layer 1 made our way must be the stub's layer 1, byte for byte, name for name."""
    from onnx import numpy_helper

    stub = {t.name: t for t in model.graph.initializer}
    expected = layer_consumed(model, 1) & set(stub)
    expected = {n for n in expected if numpy_helper.to_array(stub[n]).size > 16}
    if not set(ours) >= expected:
        raise SystemExit(f"lean export: layer 1 lacks {sorted(expected - set(ours))}")
    for name, value in ours.items():
        if name not in stub:
            raise SystemExit(f"lean export: {name} is not in the stub's graph")
        theirs = numpy_helper.to_array(stub[name])
        if theirs.shape != value.shape or theirs.tobytes() != value.tobytes():
            raise SystemExit(f"lean export: layer 1's {name} differs from the stub's")


def grow(
    model: Any, layers: int, weights: Iterator[tuple[int, dict[str, np.ndarray]]], out: Path
) -> None:
    """The stub graph with layers 2..layers-1 cloned from layer 1, written to `out` with every
    initializer over INLINE_BYTES in DATA_FILE; `weights` yields each clone's initializers."""
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    for node in graph.node:
        if in_layer(node.name, 1) and any(a.type in (5, 10) for a in node.attribute):
            raise SystemExit(f"lean export: {node.name} has a subgraph; cannot clone it")
    produced_by = {o: n for n in graph.node for o in n.output}
    # Satellites first: each clone's come before its layer's nodes in the graph's order, as
    # the exporter places them (the engine's graph edits read a graph in node order).
    l1 = satellites(graph) + [n for n in graph.node if in_layer(n.name, 1)]
    l1_outputs = {o for n in l1 for o in n.output}
    tail = [n for n in graph.node if not in_layer(n.name, 0) and not in_layer(n.name, 1)]
    # The residual: what layer 1 hands to the nodes after it (the final norm).
    handed = {i for n in tail for i in n.input if i in l1_outputs}
    if len(handed) != 1:
        raise SystemExit(f"lean export: layer 1 hands on {sorted(handed)}, not one residual")
    (last_out,) = handed
    first_in = last_out.replace("layers.1/", "layers.0/")
    if first_in not in produced_by or not in_layer(produced_by[first_in].name, 0):
        raise SystemExit(f"lean export: layer 0 has no {first_in}")
    owned = layer_consumed(model, 1)  # initializers of layer 1's own (cloned per layer)
    inits = {t.name: t for t in graph.initializer}
    data = (out / DATA_FILE).open("wb")

    def external(tensor: Any, raw: bytes) -> Any:
        offset = data.tell()
        pad = -offset % 4096
        data.write(b"\0" * pad)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", DATA_FILE), ("offset", offset + pad), ("length", len(raw))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        data.write(raw)
        return tensor

    def store(name: str, value: np.ndarray) -> Any:
        tensor = numpy_helper.from_array(value, name)
        return tensor if value.nbytes <= INLINE_BYTES else external(tensor, tensor.raw_data)

    new_inits = []
    for tensor in graph.initializer:  # the stub's own, streamed out
        value = numpy_helper.to_array(tensor)
        new_inits.append(store(tensor.name, value))
    cloned: list[Any] = []  # every clone, in layer order: they go after layer 1's last node
    new_inputs = list(graph.input)
    new_outputs = list(graph.output)
    values = list(graph.value_info)
    for layer, layer_inits in weights:
        if layer < STUB_LAYERS:
            continue
        previous = last_out if layer == STUB_LAYERS else renumber(last_out, layer - 1)
        rename = {name: renumber(name, layer) for name in l1_outputs}
        rename.update({name: renumber(name, layer) for name in owned})
        rename[first_in] = previous
        for name, value in layer_inits.items():
            if name not in owned:
                raise SystemExit(f"lean export: {name} is not an initializer of layer 1 alone")
            new_inits.append(store(rename[name], value))
        for name in owned - set(layer_inits):  # small constants of layer 1's: copied
            value = numpy_helper.to_array(inits[name])
            new_inits.append(store(rename[name], value))
        for node in l1:
            clone = type(node)()
            clone.CopyFrom(node)
            clone.name = renumber(node.name, layer)
            for i, name in enumerate(clone.input):
                if name.startswith("past_key_values.1."):
                    clone.input[i] = renumber(name, layer)
                else:
                    clone.input[i] = rename.get(name, name)
            for i, name in enumerate(clone.output):
                clone.output[i] = rename[name]
            cloned.append(clone)
        for source, target in ((graph.input, new_inputs), (graph.output, new_outputs)):
            for item in source:
                if item.name.startswith(("past_key_values.1.", "present.1.")):
                    clone = type(item)()
                    clone.CopyFrom(item)
                    clone.name = renumber(item.name, layer)
                    target.append(clone)
        for item in graph.value_info:
            if item.name in l1_outputs:
                clone = type(item)()
                clone.CopyFrom(item)
                clone.name = rename[item.name]
                values.append(clone)
        say(f"layer {layer} written")
    final = renumber(last_out, layers - 1)
    for node in tail:
        for i, name in enumerate(node.input):
            if name == last_out:
                node.input[i] = final
    # The stub's order kept (the engine's graph edits read a graph in node order, and an
    # `Identity` the exporter put before a projection must stay before it), the clones after
    # layer 1's last node; the sort then moves only what reads the last layer.
    end = max(i for i, n in enumerate(graph.node) if in_layer(n.name, 1))
    nodes = [*graph.node[: end + 1], *cloned, *graph.node[end + 1 :]]
    data.close()
    order = {"past_key_values": 1, "present": 1}

    def key(item: Any) -> tuple[int, int, str]:
        parts = item.name.split(".")
        if parts[0] in order and len(parts) == 3:
            return (1, int(parts[1]), parts[2])
        return (0, 0, "")

    del graph.node[:]
    graph.node.extend(toposorted(nodes))
    del graph.initializer[:]
    graph.initializer.extend(new_inits)
    for field, items in ((graph.input, new_inputs), (graph.output, new_outputs)):
        ordered = sorted(items, key=key)  # stable: logits and the other inputs stay first
        del field[:]
        field.extend(ordered)
    del graph.value_info[:]
    graph.value_info.extend(values)
    onnx.save_model(model, str(out / MODEL_FILE))


def satellites(graph: Any) -> list[Any]:
    """Nodes outside the layers that only layer 1 reads, made from initializers alone: the
    `Identity` through which the exporter hands a layer a weight equal to another's (a zero
    bias, a unit norm) and such `Constant`s. The exporter makes these per layer, so each clone
    gets its own (a layer reading another's `Identity` is a graph optimum never writes)."""
    inits = {t.name for t in graph.initializer}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    found = []
    for node in graph.node:
        if in_layer(node.name, 0) or in_layer(node.name, 1) or node.op_type == "If":
            continue
        if not all(name in inits for name in node.input if name):
            continue
        users = [r for o in node.output for r in readers.get(o, [])]
        if users and all(in_layer(r.name, 1) for r in users) and not set(node.output) & outputs:
            found.append(node)
    return found


def toposorted(nodes: list[Any]) -> list[Any]:
    """`nodes` in an order where every node follows the producers of its inputs (the given
    order among those that are ready together)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waiting = [
        {producer[x] for x in n.input if x in producer and producer[x] != i}
        for i, n in enumerate(nodes)
    ]
    users: dict[int, list[int]] = {}
    for i, needs in enumerate(waiting):
        for j in needs:
            users.setdefault(j, []).append(i)
    import heapq

    ready = [i for i, needs in enumerate(waiting) if not needs]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(nodes[i])
        for u in users.get(i, []):
            waiting[u].discard(i)
            if not waiting[u]:
                heapq.heappush(ready, u)
    if len(out) != len(nodes):
        raise SystemExit("lean export: the grown graph has a cycle")
    return out


def engine_check(out: Path) -> str:
    """Load the export like the server and generate 8 greedy tokens, as `export-model` ends."""
    from api.engine.local_engine import LocalEngine
    from api.engine.protocol import ChatMessage, GenerationRequest, SamplingParams

    async def run() -> str:
        engine = LocalEngine(out.name, out)
        await engine.start()
        try:
            ids = engine.encode_chat([ChatMessage("user", "Hello!")])
            request = GenerationRequest("check", ids, SamplingParams(max_tokens=8, temperature=0))
            return "".join([o.text async for o in engine.generate(request)])
        finally:
            await engine.shutdown()

    return asyncio.run(run())


def main() -> int:
    if sys.argv[1:2] == ["untied-stub"]:
        quantize = sys.argv[sys.argv.index("--quantize") + 1] if "--quantize" in sys.argv else None
        untied_stub(Path(sys.argv[2]), Path(sys.argv[3]), quantize)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--quantize", choices=("int8", "int4"))
    parser.add_argument("--work", type=Path, help="where the stub goes (default: OUT's parent)")
    parser.add_argument("--no-check", action="store_true", help="skip the engine's generation")
    args = parser.parse_args()
    import onnx

    src, out = args.src, args.out
    work = args.work or out.parent
    config = json.loads((src / "config.json").read_text())
    layers = config["num_hidden_layers"]
    files = source_tensors(src)
    stub = work / "lean-stub-src"
    if not (stub / "model.safetensors").exists():
        shutil.rmtree(stub, ignore_errors=True)
        make_stub(src, stub)
        say(f"stub of {STUB_LAYERS} layers written to {stub}")
    fp32_stub = work / "lean-stub-fp32"
    if not (fp32_stub / ".complete").exists():
        shutil.rmtree(fp32_stub, ignore_errors=True)
        export_stub(stub, fp32_stub, None)
        (fp32_stub / ".complete").touch()
    forms = weight_forms(onnx.load(str(fp32_stub / MODEL_FILE), load_external_data=True), files)
    say(f"layer 1's weights in the stub graph: {len(forms[0])} its own, shared {forms[1]}")
    q_stub = fp32_stub
    if args.quantize:
        q_stub = work / f"lean-stub-{args.quantize}"
        if not (q_stub / ".complete").exists():
            shutil.rmtree(q_stub, ignore_errors=True)
            export_stub(stub, q_stub, args.quantize)
            (q_stub / ".complete").touch()
        say(f"stub quantized to {args.quantize}")
    model = onnx.load(str(q_stub / MODEL_FILE), load_external_data=True)
    check_layer1(model, layer_weights(1, files, forms, args.quantize))
    say("layer 1 made layer by layer matches the stub's, byte for byte")
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    for file in q_stub.iterdir():
        if file.is_file() and not file.name.startswith((MODEL_FILE, ".")):
            shutil.copy2(file, out / file.name)
    for name in ("config.json", "generation_config.json"):  # SRC's, not the stub's 2 layers
        if (src / name).exists():
            shutil.copy2(src / name, out / name)
    weights = ((k, layer_weights(k, files, forms, args.quantize)) for k in range(2, layers))
    grow(model, layers, weights, out)
    del model
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    say(f"written: {out} ({size / 1e9:.2f} GB)")
    if not args.no_check:
        say(f"the engine generates {engine_check(out)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
