"""Every cache ortfuse writes (zoo models, fused plans, tuning decisions, compiled kernels) lives under
one root: ``$ORTFUSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ortfuse``, else ``~/.cache/ortfuse``
(``ortfuse.foundation.cache_paths``), and no other module builds a cache folder of its own."""

from __future__ import annotations

import pathlib
import re

import pytest

import ortfuse
from ortfuse import models
from ortfuse.custom_ops import numba_setup
from ortfuse.foundation import cache_paths
from ortfuse.models import cache as model_cache
from ortfuse.runtime import plan_cache
from ortfuse.tune import tuner

from model_fixtures import ffn_matmul_add_relu

ROOT = pathlib.Path(__file__).resolve().parents[1]

# each cache user -> the folder it writes to
USERS = {
    "models": lambda: model_cache.model_path("any").parent,
    "plans": plan_cache.root,
    "tuning": tuner.cache_root,
    "numba": lambda: pathlib.Path(numba_setup.cache_root()),
}


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No cache variable set, HOME in a temporary folder; the test sets what it checks."""
    for name in (cache_paths.ENV, cache_paths.XDG_ENV, "NUMBA_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def _roots(tmp_path) -> dict:
    return {
        "ORTFUSE_CACHE_DIR": ({cache_paths.ENV: str(tmp_path / "own")}, tmp_path / "own"),
        "XDG_CACHE_HOME": ({cache_paths.XDG_ENV: str(tmp_path / "xdg")}, tmp_path / "xdg" / "ortfuse"),
        "both": ({cache_paths.ENV: str(tmp_path / "own"), cache_paths.XDG_ENV: str(tmp_path / "xdg")},
                 tmp_path / "own"),
        "neither": ({}, tmp_path / "home" / ".cache" / "ortfuse"),
        "relative XDG_CACHE_HOME": ({cache_paths.XDG_ENV: "rel"}, tmp_path / "home" / ".cache" / "ortfuse"),
    }


@pytest.mark.parametrize("case", ["ORTFUSE_CACHE_DIR", "XDG_CACHE_HOME", "both", "neither",
                                  "relative XDG_CACHE_HOME"])
@pytest.mark.parametrize("user", sorted(USERS))
def test_every_cache_user_lands_under_the_root(env, tmp_path, case, user):
    variables, root = _roots(tmp_path)[case]
    for name, value in variables.items():
        env.setenv(name, value)
    assert cache_paths.cache_dir() == root
    assert USERS[user]() == root / user


def test_numba_cache_dir_still_wins_for_compiled_kernels(env, tmp_path):
    env.setenv(cache_paths.ENV, str(tmp_path / "own"))
    env.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    assert pathlib.Path(numba_setup.cache_root()) == tmp_path / "numba"


def test_a_session_and_the_zoo_write_only_under_the_root(env, tmp_path):
    env.setenv(cache_paths.ENV, str(tmp_path / "own"))
    env.setenv("ORTFUSE_TUNE", "off")
    model = tmp_path / "ffn.onnx"
    model.write_bytes(ffn_matmul_add_relu().SerializeToString())
    session = ortfuse.InferenceSession(str(model), fusion=True)
    assert session.fusion_report.applied
    ortfuse.InferenceSession(str(model), fusion="auto")  # reads (and finds no) tuning decisions
    models.build("mlp_gemm_relu_gelu")
    written = {p.relative_to(tmp_path).parts[:2] for p in tmp_path.rglob("*") if p.is_file()} - {("ffn.onnx",)}
    assert {("own", "plans"), ("own", "models")} <= written, written
    assert all(parts[0] == "own" for parts in written), written
    assert not (tmp_path / "home").exists()


# how a module would build a cache folder by hand
_BY_HAND = re.compile(r"XDG_CACHE_HOME|Path\.home\(\)|expanduser\(\"~\"\)|[\"']\.cache[\"']")


def test_no_other_module_builds_a_cache_folder():
    sources = [p for folder in ("ortfuse", "custom_ops", "models") for p in (ROOT / folder).rglob("*.py")]
    offenders = [str(p.relative_to(ROOT)) for p in sources
                 if p.name != "cache_paths.py" and _BY_HAND.search(p.read_text())]
    assert offenders == [], offenders
