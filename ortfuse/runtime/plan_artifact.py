"""A tuned plan as one file that travels to identical machines (``ortfuse tune MODEL --export PLAN``)
and is installed into the local plan cache by a ``fusion="auto"`` session given it (``plan=``, the
config entry ``ortfuse.plan`` or ``$ORTFUSE_PLAN``), so that it serves fused from its first run.

File layout (no pickle, no archive format to trust): the line ``ORTFUSE-PLAN 1``, one line of JSON
header ``{"members": [[name, size], ...], "sha256": hex}``, then the members' bytes in that order:
``plan.json`` (what the plan is valid for, the plan cache entry, the decisions) and, for an applied
plan, ``model.onnx`` (the fused model as the plan cache stores it). ``sha256`` is taken over every
member as ``name NUL size NUL bytes``; it is checked before anything in the file is read.

Valid when, compared with this process: the source model's identity (``plan_cache.identity``: the
sha256 of its bytes and external-data files), the CPU (``isa.fingerprint``), the versions of
ortfuse, onnxruntime, onnxruntime-extensions, numba and onnx, ortfuse's code digest
(``source_digest.code_digest``), the session settings the plan depends on (level, intra-op threads,
tune dims, precision, patterns) and the plan-shaping environment (``plan_cache`` key's variables
but ``ORTFUSE_TUNE``) all match. Otherwise ``use`` returns one sentence saying which differs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

from ortfuse.foundation import isa, source_digest, versions
from ortfuse.foundation.files import write_atomic
from ortfuse.foundation.messages import one_sentence
from ortfuse.foundation.session_options import DIMS_KEY, PRECISION_OPTION, config_entry
from ortfuse.runtime import plan_cache

PLAN_OPTION = "ortfuse.plan"  # SessionOptions config entry: path of a plan file (wins over $ORTFUSE_PLAN)
PLAN_ENV = "ORTFUSE_PLAN"
MAGIC = b"ORTFUSE-PLAN 1\n"
MAX_HEADER = 1 << 16
PLAN_MEMBER, MODEL_MEMBER = "plan.json", "model.onnx"
VERSIONED = (*versions.RUNTIME_DISTS, "onnx")
_ENV_KEYS = tuple(k for k in plan_cache._ENV_KEYS if k != "ORTFUSE_TUNE")  # when auto measures: not the plan


class PlanFileError(ValueError):
    """A plan file that cannot be used, with the reason in one sentence."""


def digest(members: list[tuple[str, bytes]]) -> str:
    """sha256 over ``name NUL size NUL bytes`` of every member, in order."""
    h = hashlib.sha256()
    for name, data in members:
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def write(path: str, members: list[tuple[str, bytes]]) -> None:
    """Write ``members`` as a plan file signed with their ``digest`` (atomically, private)."""
    write_atomic(path, encode(members))


def read(path: str) -> dict[str, bytes]:
    """The members of the plan file at ``path`` after checking its digest; PlanFileError otherwise."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise PlanFileError(f"the plan file cannot be read ({one_sentence(exc)})") from exc
    return read_bytes(raw)


def read_bytes(raw: bytes) -> dict[str, bytes]:
    """The members of the plan file ``raw`` after checking its digest; PlanFileError otherwise."""
    if not raw.startswith(MAGIC):
        raise PlanFileError("the file is not an ortfuse plan (it does not start with ORTFUSE-PLAN 1)")
    end = raw.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER)
    try:
        header = json.loads(raw[len(MAGIC):end]) if end > 0 else {}
        listed = [(str(name), int(size)) for name, size in header["members"]]
        signed = str(header["sha256"])
    except (ValueError, TypeError, KeyError) as exc:
        raise PlanFileError("the plan file's header is damaged") from exc
    body, members, at = raw[end + 1:], [], 0
    if len({name for name, _ in listed}) != len(listed):
        raise PlanFileError("the plan file's header names a member twice")
    if any(size < 0 for _, size in listed) or sum(size for _, size in listed) != len(body):
        raise PlanFileError("the plan file's size does not match its header (truncated or altered)")
    for name, size in listed:
        members.append((name, body[at:at + size]))
        at += size
    if not hmac.compare_digest(digest(members), signed):
        raise PlanFileError("the plan file's integrity digest does not match its contents (damaged or altered)")
    return dict(members)


def _settings(sess_options, fusion_patterns) -> dict:
    """What the plan depends on in the session's request, ORT's defaults spelled out."""
    level = sess_options.graph_optimization_level if sess_options is not None else None
    return {"level": str(level) if level is not None else "GraphOptimizationLevel.ORT_ENABLE_ALL",
            "threads": sess_options.intra_op_num_threads if sess_options is not None else 0,
            "tune_dims": config_entry(sess_options, DIMS_KEY) or None,
            "precision": config_entry(sess_options, PRECISION_OPTION) or None,
            "patterns": sorted(fusion_patterns) if fusion_patterns is not None else None}


def valid_for(source: str | bytes, sess_options, fusion_patterns) -> dict | None:
    """What a plan made in this process for this request is valid for (``plan.json``'s ``valid_for``);
    None when the model's identity cannot be had."""
    found = plan_cache.identity(source)
    if found is None:
        return None
    return {"model": found[0], "cpu": isa.fingerprint(), "versions": versions.installed(VERSIONED),
            "code": source_digest.code_digest(), "settings": _settings(sess_options, fusion_patterns),
            "environment": {k: os.environ.get(k) for k in _ENV_KEYS}}


def export(source: str, sess_options, fusion_patterns, tuning, out: str) -> str:
    """Write the plan ``fusion="auto"`` makes of ``source`` with ``tuning`` (final decisions) to
    ``out``; return a one-line summary. PlanFileError when there is nothing final to export."""
    members, kept = export_members(source, sess_options, fusion_patterns, tuning)
    write(out, members)
    return (f"plan written to {out}: {kept} fusion(s) kept" if len(members) > 1
            else f"plan written to {out}: no fusion kept, sessions given it serve stock ORT without tuning")


def encode(members: list[tuple[str, bytes]]) -> bytes:
    """The plan file of ``members``, signed with their ``digest``."""
    header = {"members": [[name, len(data)] for name, data in members], "sha256": digest(members)}
    return MAGIC + json.dumps(header).encode() + b"\n" + b"".join(data for _, data in members)


def export_members(source: str | bytes, sess_options, fusion_patterns, tuning) -> tuple[list, int]:
    """The members of the plan file ``export`` writes, and how many fusions the plan keeps."""
    from ortfuse.runtime.planning import plan_entry, prepare

    if not tuning.cacheable or tuning.failure:
        raise PlanFileError("the decisions are not final (a spent budget or a failed measurement); "
                            "tune again with a larger --budget")
    valid = valid_for(source, sess_options, fusion_patterns)
    if valid is None:
        raise PlanFileError("the model's content digest cannot be had (unreadable or changing files)")
    prepared = prepare(source, sess_options, "auto", fusion_patterns, mode="off", tuning=tuning)
    plan = prepared.plan
    entry = plan_entry(plan, prepared.report)
    members = [(PLAN_MEMBER, json.dumps({"valid_for": valid, "entry": entry,
                                         "decisions": tuning.to_dict()}).encode())]
    if plan is not None:
        if isinstance(plan.source, bytes):
            members.append((MODEL_MEMBER, plan.source))
        else:
            with open(plan.source, "rb") as f:
                members.append((MODEL_MEMBER, f.read()))
    return members, sum(d.keep for d in tuning.decisions)


def configured(sess_options, given: str | os.PathLike | None) -> str | None:
    """The plan file a session is given: ``plan=``, else the config entry, else the environment."""
    if given is not None:
        return os.fspath(given)
    return config_entry(sess_options, PLAN_OPTION) or os.environ.get(PLAN_ENV) or None


def _mismatch(expected: dict, here: dict) -> str:
    """The first way the plan's validity differs from this process, as a sentence part; "" if none."""
    if expected.get("model") != here["model"]:
        return "it was made from other model bytes (content digest differs)"
    if expected.get("cpu") != here["cpu"]:
        return "it was tuned on another CPU (the CPU fingerprint differs)"
    theirs = expected.get("versions") or {}
    for dist in VERSIONED:
        if theirs.get(dist) != here["versions"].get(dist):
            return f"it was made with {dist} {theirs.get(dist) or '(none)'}, this process runs {here['versions'][dist]}"
    if expected.get("code") != here["code"]:
        return "it was made by other ortfuse sources (the code digest differs)"
    for name, value in here["settings"].items():
        if (expected.get("settings") or {}).get(name, "?") != value:
            return f"it was tuned for {name}={(expected.get('settings') or {}).get(name)!r}, the session asks {value!r}"
    for name, value in here["environment"].items():
        if (expected.get("environment") or {}).get(name, "?") != value:
            return f"it was made with {name}={(expected.get('environment') or {}).get(name)!r}, here it is {value!r}"
    return ""


def use(path: str, source: str | bytes, sess_options, fusion_patterns, raw: bytes | None = None) -> tuple[bool, str]:
    """Install the plan file at ``path`` (``raw``: its bytes, read from a plan store, ``path`` then
    names where) into the plan cache under this session's key when it is valid here: (True, note)
    then; else (False, one sentence why it is not used). Never raises."""
    try:
        members = read(path) if raw is None else read_bytes(raw)
        try:
            content = json.loads(members[PLAN_MEMBER])
            expected, entry = content["valid_for"], dict(content["entry"])
        except (KeyError, ValueError, TypeError) as exc:
            raise PlanFileError("the plan file lacks its plan description") from exc
        here = valid_for(source, sess_options, fusion_patterns)
        if here is None:
            raise PlanFileError("the model's content digest cannot be had (unreadable or changing files)")
        why = _mismatch(expected, here)
        if why:
            raise PlanFileError(why)
        model = members.get(MODEL_MEMBER)
        key = plan_cache.key(source, sess_options, "auto", fusion_patterns, None)
        if plan_cache.load(key) is None and (plan_cache.store(key, entry, model, []) is None) != (model is None):
            raise PlanFileError("the local plan cache could not store it")
    except PlanFileError as exc:
        return False, f"plan file {path} not used: {exc}; fusion='auto' carries on as without it"
    except Exception as exc:  # a bug here must not stop a model ORT runs
        return False, f"plan file {path} not used: {one_sentence(exc)}; fusion='auto' carries on as without it"
    return True, f"plan file {path} installed in the plan cache: tuned elsewhere for this model, CPU and versions"
