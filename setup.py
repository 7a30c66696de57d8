"""The package list for setuptools; everything else is in pyproject.toml.

Every package under ``ortfuse/``, plus those under ``custom_ops/`` and ``models/``, which install as
``ortfuse.custom_ops`` and ``ortfuse.models`` (the package-dir mapping in pyproject.toml). Found, not
listed: a new folder with an ``__init__.py`` is installed without an edit here. pyproject's
``packages.find`` cannot add the ``ortfuse.`` prefix to the mapped folders, hence this file.
"""

from setuptools import find_packages, setup


def _mapped(folder: str) -> list[str]:
    return [f"ortfuse.{name}" for name in find_packages(include=[folder, f"{folder}.*"])]


setup(packages=find_packages(include=["ortfuse", "ortfuse.*"]) + _mapped("custom_ops") + _mapped("models"))
