"""A package whose ``__init__`` docstring lists its modules lists every one of them: a reader who
opens the package learns what is in it, and a module added later is named there too."""

from __future__ import annotations

import ast
import pkgutil
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the packages whose docstring is the list of their modules (the others describe their job in prose)
LISTING = ["ortfuse/bench", "ortfuse/foundation", "ortfuse/kernel_choice", "ortfuse/runtime", "ortfuse/tune",
           "custom_ops/aot", "custom_ops/kernels", "custom_ops/native"]


@pytest.mark.parametrize("package", LISTING)
def test_the_package_docstring_names_each_of_its_modules(package):
    folder = ROOT / package
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()), clean=False) or ""
    modules = [m.name for m in pkgutil.iter_modules([str(folder)]) if not m.name.startswith("_")]
    assert modules
    missing = [m for m in modules if not re.search(rf"(^\s+|``){re.escape(m)}\b", doc, re.MULTILINE)]
    assert not missing, f"{package}/__init__.py does not list {missing}"
