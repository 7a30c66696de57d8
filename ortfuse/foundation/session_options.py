"""``onnxruntime.SessionOptions`` as ortfuse builds and reads them: the one builder, and the config
entries ortfuse defines (docs/ARCHITECTURE.md §7). No heavy imports: onnxruntime is imported on use."""

from __future__ import annotations

# config entries read by ortfuse (set by the caller)
DIMS_KEY = "ortfuse.tune_dims"  # "batch=64,seq=128": the input shapes fusion="auto" is tuned for
PRECISION_OPTION = "ortfuse.precision"  # "bf16": the precision opt-in (wins over $ORTFUSE_PRECISION)
TUNE_KEY = "ortfuse.tune"  # background | sync | off: when fusion="auto" measures (wins over $ORTFUSE_TUNE)
TUNE_BUDGET_KEY = "ortfuse.tune_budget_s"  # seconds of tuning work a background tuning may spend
# config entries written by ortfuse on options it registered its custom ops on
REGISTERED_KEY = "ortfuse.custom_ops_registered"
NATIVE_KEY = "ortfuse.native_ops"
PYTHON_OPS_KEY = "ortfuse.python_ops"
# ORT's own entries ortfuse sets
INTRA_OP_SPINNING = "session.intra_op.allow_spinning"
INTER_OP_SPINNING = "session.inter_op.allow_spinning"

TUNE_ENV = "ORTFUSE_TUNE"
TUNE_MODES = ("background", "sync", "off")
_OFF_SPELLINGS = ("0", "off", "false", "no")
_ON_SPELLINGS = ("", "1", "on", "true", "yes")  # tuning on: the default mode

DEFAULT_SPINNING = False  # timed sessions: ORT's pool threads sleep after a run (docs/ARCHITECTURE.md §8)


def config_entry(sess_options, key: str) -> str:
    """A session config entry, or "" when there are no options or the key is unset (ORT raises for
    a missing key)."""
    if sess_options is None:
        return ""
    try:
        return sess_options.get_session_config_entry(key)
    except RuntimeError:
        return ""


def tune_mode(sess_options) -> str:
    """When ``fusion="auto"`` measures: ``background`` (default: serve at once, tune on live feeds,
    swap), ``sync`` (measure while the session is created) or ``off`` (cached decisions only). The
    ``ortfuse.tune`` config entry wins over ``$ORTFUSE_TUNE``; off/0/false/no mean off, on/1/true/yes
    the default; an unknown value is warned about and taken as the default."""
    import os

    raw = config_entry(sess_options, TUNE_KEY) or os.environ.get(TUNE_ENV, "")
    value = raw.strip().lower()
    if value in TUNE_MODES:
        return value
    if value in _OFF_SPELLINGS:
        return "off"
    if value not in _ON_SPELLINGS:
        import warnings

        warnings.warn(f"ortfuse: unknown tuning mode {raw!r} (ortfuse.tune / ORTFUSE_TUNE: background, sync or "
                      "off); using background", stacklevel=3)
    return "background"


def sleep_after_runs(so) -> None:
    """Make the pool threads of sessions made with ``so`` sleep after a run instead of spinning
    (both of ORT's spinning entries "0"; an entry already "0" is left as it is: ORT warns on a rewrite)."""
    for key in (INTRA_OP_SPINNING, INTER_OP_SPINNING):
        if config_entry(so, key) != "0":
            so.add_session_config_entry(key, "0")


def make_options(level=None, *, threads: int = 0, spinning: bool = True, quiet: bool = False,
                 precision: str | None = None):
    """A new ``onnxruntime.SessionOptions``: graph optimization ``level`` (a ``GraphOptimizationLevel``
    or its name; None: ORT's default), ``threads`` intra-op threads (0: ORT's default), ORT's pool
    threads sleeping after a run unless ``spinning``, errors-only logging when ``quiet``, and the
    ``precision`` opt-in entry when one is given."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if level is not None:
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level) if isinstance(level, str) else level
    if threads:
        so.intra_op_num_threads = int(threads)
    if not spinning:
        sleep_after_runs(so)
    if quiet:
        so.log_severity_level = 3  # ORT's warnings would break tables and progress bars
    if precision:
        so.add_session_config_entry(PRECISION_OPTION, precision)
    return so


def measuring_options(level, *, threads: int = 0, spinning: bool = DEFAULT_SPINNING):
    """SessionOptions for a session that is timed (bench, tune): ``level``, errors-only logging,
    ``threads`` intra-op threads (0: ORT's default), pool threads sleeping unless ``spinning``."""
    return make_options(level, threads=threads, spinning=spinning, quiet=True)
