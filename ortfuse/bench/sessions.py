"""The configurations ``ortfuse bench`` compares, and the timed session each one makes.

Every configuration is its own session on the same model and inputs, on the CPU provider:

    ort_disable_all    stock onnxruntime.InferenceSession, ORT_DISABLE_ALL (numeric reference)
    ort_enable_all     stock onnxruntime.InferenceSession, ORT_ENABLE_ALL (baseline of every ratio)
    ortfuse_auto       ortfuse.InferenceSession(fusion="auto"), ORT_ENABLE_ALL
    ortfuse_fused      ortfuse.InferenceSession(fusion=True), ORT_ENABLE_ALL: every legal match fused, with
                       the kernels the registry picks (native ones from the ahead-of-time library)
    ort_enable_all_b   a second, independent stock ORT_ENABLE_ALL session: the A/A control
    openvino_f32       OpenVINO's CPU plugin, float32 forced (``--peer openvino``; ``ortfuse.bench.peers``)
    ort_transformers   ORT's transformer optimizer (model_type bert), then ORT_ENABLE_ALL (``--peer ort-transformers``)

Sessions are built with ``measuring_options`` (ortfuse.foundation.session_options), the same options
``ortfuse tune`` times with. This module imports neither onnxruntime nor ortfuse until a session is
made, so the memory child (``ortfuse.bench.memory``) makes its one session without the rest of the bench.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortfuse.foundation.session_options import DEFAULT_SPINNING, DIMS_KEY, TUNE_KEY, measuring_options
from ortfuse.ir.model_args import format_dims


@dataclass(frozen=True)
class Config:
    name: str
    runtime: str  # "onnxruntime" (stock), "ortfuse", or a peer ("openvino", "ort-transformers")
    level: str  # name of an onnxruntime.GraphOptimizationLevel
    fusion: object  # ortfuse's fusion= argument; None for stock sessions
    description: str

    @property
    def stock(self) -> bool:
        return self.runtime == "onnxruntime"


REFERENCE = "ort_disable_all"  # numeric reference for max |diff|
BASELINE = "ort_enable_all"  # denominator of every ratio
CONTROL = "ort_enable_all_b"  # A/A control: identical to BASELINE, measured the same way

CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        Config(REFERENCE, "onnxruntime", "ORT_DISABLE_ALL", None, "stock onnxruntime, graph optimizations off"),
        Config(BASELINE, "onnxruntime", "ORT_ENABLE_ALL", None, "stock onnxruntime, all graph optimizations"),
        Config("ortfuse_auto", "ortfuse", "ORT_ENABLE_ALL", "auto", 'ortfuse fusion="auto"'),
        Config("ortfuse_fused", "ortfuse", "ORT_ENABLE_ALL", True, "ortfuse fusion=True"),
        Config(CONTROL, "onnxruntime", "ORT_ENABLE_ALL", None, "A/A control: second stock ORT_ENABLE_ALL session"),
        Config("openvino_f32", "openvino", "", None, "OpenVINO CPU plugin, f32 forced, same threads"),
        Config("ort_transformers", "ort-transformers", "ORT_ENABLE_ALL", None,
               "ORT's transformer optimizer (model_type bert), then ORT_ENABLE_ALL, same threads"),
    )
}
# Former configuration names, read as the current ones (``--configs``; result files written before).
RENAMED_CONFIGS = {"ortfuse_numba": "ortfuse_fused"}
PEER_RUNTIMES = ("openvino", "ort-transformers")
DEFAULT_CONFIGS: tuple[str, ...] = tuple(c for c in CONFIGS if CONFIGS[c].runtime not in PEER_RUNTIMES)


def make_session(config: str | Config, model, *, spinning: bool = DEFAULT_SPINNING, threads: int = 0, batch: int = 1,
                 dims: dict[str, int] | None = None):
    """Create the session of one configuration on ``model`` (a path or bytes), on the CPU provider.
    An ortfuse session is planned for inputs of ``batch`` and the named dynamic ``dims`` (the
    ``ortfuse.tune_dims`` entry: ``auto`` tunes at them, the layout step times its native convs at
    them); the timed inputs have those dims."""
    import onnxruntime as ort

    cfg = CONFIGS[RENAMED_CONFIGS.get(config, config)] if isinstance(config, str) else config
    if cfg.runtime == "openvino":
        from ortfuse.bench.peers import OpenVinoSession

        return OpenVinoSession(model, threads=threads)
    if cfg.runtime == "ort-transformers":
        from ortfuse.bench.peers import OrtTransformersSession

        return OrtTransformersSession(model, threads=threads, spinning=spinning)
    so = measuring_options(cfg.level, threads=threads, spinning=spinning)
    providers = ["CPUExecutionProvider"]
    if not cfg.stock and cfg.fusion is not False:
        named = {k: v for k, v in (dims or {}).items() if k != "batch"}
        so.add_session_config_entry(DIMS_KEY, format_dims({"batch": batch, **named}))
    if cfg.fusion == "auto":  # tuned at creation, so that the timed runs are those of the tuned plan
        so.add_session_config_entry(TUNE_KEY, "sync")
    if cfg.stock:
        return ort.InferenceSession(model, so, providers=providers)
    import ortfuse

    return ortfuse.InferenceSession(model, so, providers=providers, fusion=cfg.fusion)
