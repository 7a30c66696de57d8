"""``ortfuse export``: a fused model with its ops library, as a Triton Inference Server model
repository entry (ONNX Runtime backend) that plain onnxruntime loads too (docs/ARCHITECTURE.md §6b).

    ortfuse export model.onnx --out repo                 # this machine's ISA level
    ortfuse export model.onnx --out repo --isa avx2 --name detector

writes ``repo/<name>/config.pbtxt``, ``repo/<name>/1/model.onnx`` (the fused graph, as
``ortfuse-annotate --rewrite`` saves it), ``repo/<name>/libortfuse_ops-<level>.so`` (the library
ortfuse built for that level, checked by its key as the cache requires) and ``repo/<name>/README.txt``
(the lines that load it in plain onnxruntime, also printed). A model with nothing to fuse is written
unchanged, without a library.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass

import onnx
from onnx import TensorProto

# ONNX element type -> Triton's ModelConfig DataType
TRITON_TYPES = {
    TensorProto.FLOAT: "TYPE_FP32", TensorProto.FLOAT16: "TYPE_FP16", TensorProto.DOUBLE: "TYPE_FP64",
    TensorProto.BFLOAT16: "TYPE_BF16", TensorProto.BOOL: "TYPE_BOOL", TensorProto.STRING: "TYPE_STRING",
    TensorProto.INT8: "TYPE_INT8", TensorProto.INT16: "TYPE_INT16", TensorProto.INT32: "TYPE_INT32",
    TensorProto.INT64: "TYPE_INT64", TensorProto.UINT8: "TYPE_UINT8", TensorProto.UINT16: "TYPE_UINT16",
    TensorProto.UINT32: "TYPE_UINT32", TensorProto.UINT64: "TYPE_UINT64",
}
# Triton's own default for a model that batches (tritonserver --backend-config=default-max-batch-size)
DEFAULT_MAX_BATCH = 4
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class ExportError(ValueError):
    """The model cannot be exported as asked; the message is one sentence for the user."""


@dataclass
class Tensor:
    """One model input or output: name, Triton data type, dims (None: dynamic)."""

    name: str
    data_type: str
    dims: list[int | None]


@dataclass
class Exported:
    """What ``export`` wrote: the model directory, the model file, the library (None: not needed)."""

    model_dir: str
    model_path: str
    library: str | None
    config_library: str | None
    fused: int
    note: str


def add_arguments(p) -> None:
    from ortfuse.fusion.catalogue import PATTERN_IDS

    p.add_argument("model", help="path of the .onnx model (or a zoo model name)")
    p.add_argument("--out", required=True, metavar="DIR", help="model repository folder to write into")
    p.add_argument("--isa", metavar="LEVEL",
                   help="ISA level of the ops library: generic, avx2, avx512 or amx, one the target CPUs have "
                        "(default: this machine's)")
    p.add_argument("--pattern", action="append", dest="patterns", metavar="ID",
                   help=f"pattern id to fuse (repeatable; default: all); one of: {', '.join(PATTERN_IDS)}")
    p.add_argument("--name", help="model name in the repository (default: the model file's name)")
    p.add_argument("--repo-path", metavar="PATH",
                   help="where the server sees DIR (op_library_filename in config.pbtxt; default: DIR's absolute "
                        "path)")
    p.add_argument("--max-batch-size", type=int, default=DEFAULT_MAX_BATCH, metavar="N",
                   help=f"max_batch_size when every input and output has a dynamic first dim (default "
                        f"{DEFAULT_MAX_BATCH}, Triton's own; 0: no batching)")


def run(args) -> int:
    from ortfuse.custom_ops.aot.library import LibraryError
    from ortfuse.fusion.catalogue import UnknownPatternError
    from ortfuse.ir.model_args import ModelArgError

    try:
        done = export(args.model, args.out, isa_level=args.isa, patterns=args.patterns, name=args.name,
                      repo_path=args.repo_path, max_batch_size=args.max_batch_size)
    except (UnknownPatternError, ModelArgError, ExportError) as exc:
        print(f"ortfuse export: {exc}", file=sys.stderr)
        return 2
    except LibraryError as exc:
        print(f"ortfuse export: {exc}", file=sys.stderr)
        return 1
    with open(os.path.join(done.model_dir, "README.txt")) as fh:
        print(fh.read(), end="")
    return 0


def export(model_arg: str, out: str, isa_level: str | None = None, patterns: list[str] | None = None,
           name: str | None = None, repo_path: str | None = None,
           max_batch_size: int = DEFAULT_MAX_BATCH) -> Exported:
    """Write the repository entry for ``model_arg`` into ``out`` (see the module docstring)."""
    from ortfuse import models
    from ortfuse.fusion.catalogue import validate_patterns
    from ortfuse.fusion.rewrite import fuse
    from ortfuse.ir import model_args

    validate_patterns(patterns)
    level = _level(isa_level)
    if max_batch_size < 0:
        raise ExportError(f"--max-batch-size {max_batch_size} is negative: give 0 (no batching) or more")
    path = models.resolve(model_arg)
    model = model_args.load(path)
    name = name if name is not None else re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.splitext(os.path.basename(path))[0])
    if not _NAME.match(name) or name in (".", ".."):
        raise ExportError(f"model name {name!r} is not a folder name Triton takes: use letters, digits, '_', '.' "
                          "or '-'")
    tensors = io_tensors(model)
    fused, report = fuse(model, patterns)
    # the rewriter looked for matches and fused none (its reason says why): the model goes out unchanged;
    # a model it would not even match (already fused, invalid, opset too old) is refused
    if not report.applied and not report.matches and report.reason != "no pattern matched":
        raise ExportError(f"{path} cannot be fused: {report.reason}")
    custom = library_ops(fused, level) if report.applied else set()

    model_dir = os.path.join(out, name)
    os.makedirs(os.path.join(model_dir, "1"), exist_ok=True)
    model_path = os.path.join(model_dir, "1", "model.onnx")
    from ortfuse.cli.annotate import save

    save(fused if report.applied else model, model_path)
    library = config_library = None
    if custom:
        library = _place_library(level, model_dir)
        base = repo_path if repo_path is not None else os.path.abspath(out)
        config_library = os.path.join(base, name, os.path.basename(library))
    with open(os.path.join(model_dir, "config.pbtxt"), "w") as fh:
        fh.write(triton_config(name, tensors, config_library, max_batch_size))
    fused_count = len(report.fused) if report.applied else 0
    if not report.applied:
        note = (f"nothing to fuse in {path} ({report.reason}): wrote the model unchanged (stock ORT runs it; no ops "
                "library needed)")
    elif not custom:
        note = f"fused {fused_count} match(es) into ORT's own ops: any ORT host runs it, no ops library needed"
    else:
        note = (f"fused {fused_count} match(es) ({', '.join(sorted(custom))}); ops library for ISA level {level}: "
                "run it on CPUs of that level or above")
    with open(os.path.join(model_dir, "README.txt"), "w") as fh:
        fh.write(readme(name, os.path.abspath(model_path), library and os.path.abspath(library), level, note))
    return Exported(model_dir, model_path, library, config_library, fused_count, note)


def _level(isa_level: str | None) -> str:
    from ortfuse.custom_ops.aot import library
    from ortfuse.foundation.isa import ISA_LEVELS

    if isa_level is None:
        return library.level()
    if isa_level not in ISA_LEVELS:
        raise ExportError(f"unknown ISA level {isa_level!r}: give one of {', '.join(ISA_LEVELS)}")
    return isa_level


def library_ops(fused: onnx.ModelProto, level: str) -> set[str]:
    """The fused graph's ortfuse ops, each of which the library of ``level`` must hold."""
    from ortfuse.custom_ops.registration import library_op_table, native_op_types
    from ortfuse.custom_ops.specs import DOMAIN

    custom = {n.op_type for n in fused.graph.node if n.domain == DOMAIN}
    python_only = sorted(custom - native_op_types())
    if python_only:
        raise ExportError(f"the fused graph needs ortfuse to run ({', '.join(python_only)} have no native kernel "
                          "here): leave those patterns out with --pattern, or let ortfuse.InferenceSession run it")
    missing = sorted(custom - set(library_op_table(level)))
    if missing:
        raise ExportError(f"an ops library of ISA level {level} cannot hold {', '.join(missing)}, which the fused "
                          "graph uses: export for a higher --isa level, or leave that pattern out")
    return custom


def _place_library(level: str, model_dir: str) -> str:
    """Copy the library ortfuse built for ``level`` (built now when missing; its key and digest checked by
    ``library_path``) into ``model_dir``, readable by the server's user."""
    from ortfuse.custom_ops.aot import library

    source = library.library_path(isa_level=level)
    target = os.path.join(model_dir, f"libortfuse_ops-{level}.so")
    tmp = target + ".tmp"
    shutil.copyfile(source, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return target


def io_tensors(model: onnx.ModelProto) -> dict[str, list[Tensor]]:
    """The model's inputs (initializers excluded) and outputs, output shapes inferred where missing."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - shape inference refuses some valid models; the declared shapes remain
        inferred = model
    initializers = {t.name for t in model.graph.initializer}
    declared = {v.name: v for v in inferred.graph.output}
    declared.update({v.name: v for v in inferred.graph.value_info if v.name not in declared})
    out: dict[str, list[Tensor]] = {"input": [], "output": []}
    for kind, values in (("input", [v for v in model.graph.input if v.name not in initializers]),
                         ("output", [declared.get(v.name, v) for v in model.graph.output])):
        for v in values:
            t = v.type.tensor_type
            if not v.type.HasField("tensor_type") or t.elem_type not in TRITON_TYPES:
                raise ExportError(f"{kind} {v.name!r} is not a tensor of a type Triton names (sequence or map "
                                  "values cannot be described in config.pbtxt)")
            if not t.HasField("shape"):
                raise ExportError(f"{kind} {v.name!r} has no known rank: give the model its shapes "
                                  "(onnx.shape_inference) before exporting")
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            out[kind].append(Tensor(v.name, TRITON_TYPES[t.elem_type], dims))
    return out


def triton_config(name: str, tensors: dict[str, list[Tensor]], library: str | None, max_batch_size: int) -> str:
    """``config.pbtxt`` (protobuf text of Triton's ModelConfig) for the ONNX Runtime backend: with a
    dynamic first dim on every input and output, that dim is the batch (``max_batch_size``), else 0."""
    every = tensors["input"] + tensors["output"]
    batched = max_batch_size > 0 and every and all(t.dims and t.dims[0] is None for t in every)
    lines = [f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {max_batch_size if batched else 0}"]
    for kind in ("input", "output"):
        entries = []
        for t in tensors[kind]:
            dims = [-1 if d is None else d for d in (t.dims[1:] if batched else t.dims)]
            entries.append(f'  {{\n    name: "{t.name}"\n    data_type: {t.data_type}\n'
                           f'    dims: [ {", ".join(map(str, dims))} ]\n  }}')
        lines.append(f"{kind} [\n" + ",\n".join(entries) + "\n]")
    if library is not None:
        lines.append(f'model_operations {{ op_library_filename: [ "{library}" ] }}')
    lines.append('instance_group [ { kind: KIND_CPU } ]')
    return "\n".join(lines) + "\n"


def readme(name: str, model_path: str, library: str | None, level: str, note: str) -> str:
    """How to load the export: plain onnxruntime, and Triton."""
    if library is None:
        load = ("import onnxruntime\n"
                f"sess = onnxruntime.InferenceSession({model_path!r})")
        needs = "Plain onnxruntime runs it as it is:"
    else:
        from ortfuse.custom_ops.abi import MIN_RUNTIME_API_VERSION  # ORT API version N is onnxruntime 1.N

        load = ("import onnxruntime\n"
                f"so = onnxruntime.SessionOptions(); so.register_custom_ops_library({library!r})\n"
                f"sess = onnxruntime.InferenceSession({model_path!r}, so)")
        needs = (f"Plain onnxruntime 1.{MIN_RUNTIME_API_VERSION} or newer loads it with the ops library "
                 f"(ISA level {level}) registered: the library adds the fused ops' domain ai.onnx.contrib "
                 "itself, so neither ortfuse, numba nor onnxruntime-extensions is needed.\n"
                 "Register it alone: onnxruntime-extensions' library adds the same domain, and one "
                 "SessionOptions with both fails (\"Domain already set in registry\").")
    return (f"{name}: {note}\n\n{needs}\n\n" + "\n".join("    " + line for line in load.splitlines()) +
            "\n\nTriton Inference Server (ONNX Runtime backend): tritonserver --model-repository=<this folder's "
            "parent>;\nconfig.pbtxt names the library by the path given with --repo-path (default: where it was "
            "written).\n")
