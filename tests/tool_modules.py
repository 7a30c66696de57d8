"""The developer scripts of ``tools/`` as modules for the tests: each loaded once from its file and
registered under its name in ``sys.modules`` (numba's cache finds a tool's jitted functions by module)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load(name: str):
    """``tools/<name>.py`` as the module ``name``."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
