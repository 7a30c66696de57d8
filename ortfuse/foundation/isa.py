"""CPU features, ISA levels, and the numba environment that compiles a kernel variant per ISA.

Detection runs once per process (cached): the host features as LLVM sees them
(``llvmlite.binding.get_host_cpu_features()``, the same source numba compiles for; it includes the OS
support checks of XGETBV), falling back to the ``flags`` line of ``/proc/cpuinfo``. Feature names are
LLVM's (``avx512f``, ``avx512vnni``, ``amx-tile``...); ``/proc/cpuinfo`` spellings (``avx512_vnni``,
``amx_tile``, ``sse4_2``) are translated.

ISA levels, best first: ``amx`` (AMX tiles + AVX-512; the one AMX kernel, the bf16 GEMM
``FusedGemmActBf16``, is selected only under the bf16 precision opt-in, see ``registry``; everything
else falls through to ``avx512``), ``avx512`` (F, BW, VL, DQ + AVX2/FMA),
``avx2`` (AVX2 + FMA), ``generic`` (SSE2: every x86-64).

Override for tests: ``ORTFUSE_ISA`` is either a level name (``amx``, ``avx512``, ``avx2``, ``generic``):
the host features cut down to that level (never more than the host has, so kernels chosen by it run
here), or a comma list of feature names taken literally (``avx2,fma`` or ``+avx512f,+avx512bw``), which
may describe a CPU this one is not: use it for selection logic only, never to run kernels.

numba compiles for one ISA per process: ``NUMBA_CPU_NAME`` and ``NUMBA_CPU_FEATURES`` are read once at
import (docs/ARCHITECTURE.md §5). ``numba_env(isa)`` gives those variables for a variant; run the
variant in a subprocess with them (tests/test_eltwise_kernels.py does). ``target_level(*numba_target())``
is the level this process's numba code is compiled for (the label the report shows), whatever
``ORTFUSE_ISA`` says. LLVM's tuning for recent Intel
cores prefers 256-bit vectors, so numba's default target vectorises with ymm registers even where
AVX-512 is present; ``numba_env("avx512")`` adds ``-prefer-256-bit`` for zmm code
(``test_isa_variant_compiles_numerics_and_register_width`` checks the register width of each variant).

The one reader of ``/proc/cpuinfo`` (``cpuinfo``): the fallback feature source, ``fingerprint`` and
``cpu_model``. py-cpuinfo is not used: it runs CPUID in a subprocess (about a second per call) and
reports neither LLVM's feature names nor the OS support checks LLVM's query includes.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterable

__all__ = [
    "ISA_LEVELS",
    "KERNEL_ISAS",
    "KNOWN_FEATURES",
    "LEVEL_FEATURES",
    "asm_vector_width",
    "best_isa",
    "cpu_features",
    "cpu_model",
    "cpuinfo",
    "describe",
    "fingerprint",
    "has",
    "host_features",
    "numba_env",
    "numba_target",
    "refresh",
    "select_isa",
    "supported_isas",
    "target_level",
]

ENV_VAR = "ORTFUSE_ISA"

ISA_LEVELS = ("amx", "avx512", "avx2", "generic")
# the levels ortfuse compiles kernel variants for (an AMX CPU runs the avx512 ones; the opt-in bf16 GEMM
# uses AMX tiles from inline asm in the same build: custom_ops/kernels/amx.py)
KERNEL_ISAS = ("avx512", "avx2", "generic")

# features each level needs (LLVM names)
LEVEL_FEATURES: dict[str, frozenset[str]] = {
    "generic": frozenset({"sse2"}),
    "avx2": frozenset({"sse2", "sse4.2", "avx", "avx2", "fma"}),
    "avx512": frozenset({"sse2", "sse4.2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}),
}
LEVEL_FEATURES["amx"] = LEVEL_FEATURES["avx512"] | {"amx-tile"}

# reported features (others are detected but not listed by describe())
KNOWN_FEATURES = ("sse2", "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                  "avx512dq", "avx512cd", "avx512vnni", "avx512bf16", "avx512fp16", "avxvnni",
                  "amx-tile", "amx-bf16", "amx-int8")

# /proc/cpuinfo flag -> LLVM feature name, where they differ
_CPUINFO_NAMES = {
    "sse4_1": "sse4.1", "sse4_2": "sse4.2", "avx512_vnni": "avx512vnni", "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16", "avx512_vbmi2": "avx512vbmi2", "avx512_bitalg": "avx512bitalg",
    "avx512_vpopcntdq": "avx512vpopcntdq", "avx_vnni": "avxvnni", "amx_tile": "amx-tile",
    "amx_bf16": "amx-bf16", "amx_int8": "amx-int8", "pni": "sse3", "bmi1": "bmi",
}

# features that come with AVX2-class CPUs and stay in an ``avx2`` / ``avx512`` override
_AVX2_EXTRAS = frozenset({"sse", "sse3", "ssse3", "sse4.1", "f16c", "bmi", "bmi2", "lzcnt", "popcnt", "cx16",
                          "movbe", "64bit", "cmov", "cx8", "fxsr", "mmx", "xsave"})
_BASELINE = frozenset({"sse", "sse2", "64bit", "cmov", "cx8", "fxsr", "mmx"})   # every x86-64

# numba target per level: (NUMBA_CPU_NAME, NUMBA_CPU_FEATURES)
_NUMBA_TARGETS = {
    "avx512": ("skylake-avx512",
               ("+avx512f,+avx512bw,+avx512vl,+avx512dq,+avx512cd,+avx2,+fma,+avx,+f16c,+bmi,+bmi2,+lzcnt,"
                "+popcnt,+sse4.2,+sse4.1,+ssse3,+sse3,+sse2,-prefer-256-bit")),
    "avx2": ("haswell", "+avx2,+fma,+avx,+sse4.2,-avx512f"),
    "generic": ("generic", "+sse2"),
}
_NUMBA_TARGETS["amx"] = (_NUMBA_TARGETS["avx512"][0], _NUMBA_TARGETS["avx512"][1] + ",+amx-tile,+amx-bf16,+amx-int8")


def _normalise(name: str) -> str:
    name = name.strip().lower().lstrip("+")
    return _CPUINFO_NAMES.get(name, name.replace("_", "-") if name.startswith("amx") else name)


def _from_llvm() -> frozenset[str]:
    import llvmlite.binding as llvm
    feats = llvm.get_host_cpu_features()
    return frozenset(k for k, v in feats.items() if v)


CPUINFO = "/proc/cpuinfo"


@functools.lru_cache(maxsize=4)
def cpuinfo(path: str = CPUINFO) -> dict[str, str]:
    """The fields of the first processor in ``/proc/cpuinfo`` (``model name``, ``flags``...); {} where
    the file does not exist. The one reader of that file in ortfuse (cached per path)."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    if fields:
                        break  # end of the first processor's block
                    continue
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        return {}
    return fields


def _from_cpuinfo(path: str = CPUINFO) -> frozenset[str]:
    return frozenset(_normalise(f) for f in cpuinfo(path).get("flags", "").split())


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor or machine string."""
    import platform

    return cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown CPU"


@functools.lru_cache(maxsize=1)
def _detect() -> tuple[frozenset[str], str]:
    """The host's features: LLVM's view when LLVM is loaded already (numba imported), else
    ``/proc/cpuinfo`` first: loading LLVM only to ask would add tens of MB to a session that runs
    the ahead-of-time ops library and never loads it otherwise."""
    llvm_loaded = "llvmlite.binding" in sys.modules
    if not llvm_loaded:
        feats = _from_cpuinfo()
        if feats:
            return feats, CPUINFO
    try:
        feats = _from_llvm()
        if feats:
            return feats, "llvm"
    except Exception:  # noqa: BLE001, S110 - any failure of the LLVM query falls back to /proc
        pass
    feats = _from_cpuinfo()
    if feats:
        return feats, CPUINFO
    return frozenset({"sse2"}), "assumed"


def fingerprint() -> str:
    """A cheap identity of this CPU for cache keys: its ``/proc/cpuinfo`` model name and feature flags
    (no LLVM load, which would add tens of MB of RSS to a session), else the platform's processor string."""
    import platform

    fields = cpuinfo()
    wanted = {k: fields[k] for k in ("flags", "model name") if k in fields}
    if wanted:
        return " | ".join(f"{k}: {v}" for k, v in sorted(wanted.items()))
    return f"{platform.machine()} {platform.processor()}"


def host_features() -> frozenset[str]:
    """The features of this CPU (cached; ignores ``ORTFUSE_ISA``)."""
    return _detect()[0]


@functools.lru_cache(maxsize=8)
def _features_for(override: str | None) -> frozenset[str]:
    host = host_features()
    if not override:
        return host
    value = override.strip().lower()
    if value in LEVEL_FEATURES:
        if value == "amx":
            return host
        keep = set(LEVEL_FEATURES[value]) | _BASELINE
        if value != "generic":
            keep |= _AVX2_EXTRAS
        if value == "avx512":
            keep |= {f for f in host if f.startswith("avx512")}
        return frozenset(host & keep)
    names = [n for n in re.split(r"[,\s]+", value) if n]
    if any(n in ISA_LEVELS and n not in LEVEL_FEATURES["avx2"] for n in names):
        raise ValueError(f"{ENV_VAR}={override!r}: give one level name ({', '.join(ISA_LEVELS)}) or a list of "
                         "feature names, not both")
    return frozenset(_normalise(n) for n in names if not n.startswith("-"))


def cpu_features() -> frozenset[str]:
    """The features ortfuse selects kernels for: the host's, or what ``ORTFUSE_ISA`` says."""
    return _features_for(os.environ.get(ENV_VAR) or None)


def has(feature: str) -> bool:
    return _normalise(feature) in cpu_features()


def supported_isas() -> list[str]:
    """ISA levels this CPU supports, best first, e.g. ``['amx', 'avx512', 'avx2', 'generic']``."""
    feats = cpu_features()
    return [level for level in ISA_LEVELS if LEVEL_FEATURES[level] <= feats] or ["generic"]


def best_isa() -> str:
    return supported_isas()[0]


def select_isa(available: Iterable[str]) -> str | None:
    """The best ISA of this CPU among ``available`` (the ISAs a kernel was built for), or None.
    An ``amx`` CPU takes an ``avx512`` kernel when there is no ``amx`` one, and so on down."""
    have = set(available)
    for level in supported_isas():
        if level in have:
            return level
    return None


def numba_env(isa: str) -> dict[str, str]:
    """Environment variables that make a fresh process's numba compile for ``isa`` (docs/ARCHITECTURE.md §5).
    Set them before numba is imported (a subprocess); numba's cache keys on both, so variants can
    share one ``NUMBA_CACHE_DIR``."""
    if isa not in _NUMBA_TARGETS:
        raise ValueError(f"unknown ISA {isa!r}; known: {', '.join(ISA_LEVELS)}")
    name, features = _NUMBA_TARGETS[isa]
    return {"NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": features}


def numba_target() -> tuple[str | None, str | None]:
    """(CPU name, CPU features) numba compiles for in this process: numba's config once numba is
    imported (it reads both at import), else what it will read from ``NUMBA_CPU_NAME`` and
    ``NUMBA_CPU_FEATURES``; None means the host's (numba's default)."""
    config = sys.modules.get("numba.core.config")
    if config is not None:
        return getattr(config, "CPU_NAME", None), getattr(config, "CPU_FEATURES", None)
    name, features = os.environ.get("NUMBA_CPU_NAME"), os.environ.get("NUMBA_CPU_FEATURES")
    if features is None and str(name).lower() == "generic":  # numba's own default for that name
        features = ""
    return name, features


def target_level(name: str | None, features: str | None) -> str:
    """The level (of ``KERNEL_ISAS``) of the code numba emits for CPU ``name`` with ``features``
    (``numba_target``): with no feature string numba uses the host's features, whatever the name;
    else the features the string adds (``+f``) to those ``numba_env`` implies for that name, minus
    those it removes (``-f``). ``ORTFUSE_ISA`` plays no part: this is what the code was compiled for."""
    if features is None:
        feats = set(host_features())
    else:
        parts = [f.strip().lower() for f in features.split(",") if f.strip()]
        implied = next((LEVEL_FEATURES[level] for level, (cpu, _) in _NUMBA_TARGETS.items()
                        if name is not None and cpu == name.lower()), frozenset())
        feats = (set(implied) | {_normalise(f) for f in parts if not f.startswith("-")} | _BASELINE) \
            - {_normalise(f[1:]) for f in parts if f.startswith("-")}
    return next((level for level in KERNEL_ISAS if LEVEL_FEATURES[level] <= feats), "generic")


# the widest vector register each level's code uses
VECTOR_BITS = {"amx": 512, "avx512": 512, "avx2": 256, "generic": 128}


def asm_vector_width(asm: str) -> dict[str, int]:
    """Counts of zmm / ymm / xmm register operands in x86 assembly (``dispatcher.inspect_asm``), and
    ``bits``: the widest class that occurs (512, 256, 128 or 0)."""
    counts = {cls: len(re.findall(rf"%{cls}\d+\b", asm)) for cls in ("zmm", "ymm", "xmm")}
    counts["bits"] = 512 if counts["zmm"] else 256 if counts["ymm"] else 128 if counts["xmm"] else 0
    return counts


def describe() -> dict:
    """What was detected, for reports and ``ortfuse`` CLI output."""
    feats = cpu_features()
    return {
        "source": _detect()[1],
        "override": os.environ.get(ENV_VAR) or None,
        "features": [f for f in KNOWN_FEATURES if f in feats],
        "supported_isas": supported_isas(),
        "amx": {f: f in feats for f in ("amx-tile", "amx-bf16", "amx-int8")},
        "amx_kernels": {"amx-tile", "amx-bf16"} <= feats,  # the bf16 GEMM, under the precision opt-in
    }


def refresh() -> None:
    """Forget the cached detection (tests that change ``ORTFUSE_ISA`` call this; the override itself
    is read on every call of ``cpu_features``)."""
    _detect.cache_clear()
    _features_for.cache_clear()
