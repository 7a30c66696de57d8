"""The AMX op's worker compiled for an AMX target on any x86-64 CPU (compiled, never run): the tile
micro-kernel the driver binds emits the instruction sequence of custom_ops/kernels/amx.py's docstring,
the K loop a straight run of tile loads and ``tdpbf16ps`` with no call in it."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys

import pytest

from ortfuse.foundation import isa

_SCRIPT = """
import json
from ortfuse.custom_ops.numba_setup import configure_numba

configure_numba()
import numba
from numba import types
from ortfuse.custom_ops.native.ops import gemm_bf16

worker = numba.njit(gemm_bf16.OP.worker)
worker.compile((types.int64, types.int64))
print(json.dumps(worker.inspect_asm(worker.signatures[0])))
"""


@pytest.fixture(scope="module")
def worker_asm(tmp_path_factory) -> str:
    """x86 assembly of FusedGemmActBf16's worker for the ``amx`` ISA level, from a fresh process (numba
    reads its target once), its cache in a temporary folder."""
    pytest.importorskip("numba")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"AMX code is compiled for x86-64 targets; this is {platform.machine()}")
    env = {**os.environ, **isa.numba_env("amx"), "NUMBA_CACHE_DIR": str(tmp_path_factory.mktemp("numba"))}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _blocks(asm: str) -> list[list[str]]:
    """Instructions per basic block (label to label or jump)."""
    blocks, cur = [], []
    for line in asm.splitlines():
        line = line.split("#")[0].strip()
        if not line or (line.startswith(".") and not line.endswith(":")):
            continue
        if line.endswith(":"):
            blocks.append(cur)
            cur = []
            continue
        cur.append(line)
        if line.startswith("j"):
            blocks.append(cur)
            cur = []
    return [b for b in blocks + [cur] if b]


def test_the_k_loop_is_the_tile_sequence_without_calls(worker_asm):
    loops = [b for b in _blocks(worker_asm) if any(i.startswith("tdpbf16ps") for i in b)]
    assert loops, "no tdpbf16ps in the worker"
    tiles = [[re.sub(r"\(.*\)", "(mem)", i) for i in b if i.startswith(("tileloadd", "tdpbf16ps"))] for b in loops]
    assert ["tileloadd\t(mem), %tmm4", "tileloadd\t(mem), %tmm6", "tileloadd\t(mem), %tmm7",
            "tdpbf16ps\t%tmm6, %tmm4, %tmm0", "tdpbf16ps\t%tmm7, %tmm4, %tmm1", "tileloadd\t(mem), %tmm5",
            "tdpbf16ps\t%tmm6, %tmm5, %tmm2", "tdpbf16ps\t%tmm7, %tmm5, %tmm3"] in tiles, tiles
    for b in loops:
        assert not any(i.startswith("call") for i in b), b


def test_the_worker_configures_zeroes_stores_and_releases_the_tiles(worker_asm):
    ops = re.findall(r"^\s*(ldtilecfg|tilezero|tilestored|tilerelease)\b\s*([^\n#]*)", worker_asm, re.M)
    found = {(op, re.sub(r"\(.*\)", "(mem)", arg).strip()) for op, arg in ops}
    assert {("tilezero", f"%tmm{t}") for t in range(4)} <= found
    assert {("tilestored", f"%tmm{t}, (mem)") for t in range(4)} <= found
    assert ("ldtilecfg", "(mem)") in found and ("tilerelease", "") in found
