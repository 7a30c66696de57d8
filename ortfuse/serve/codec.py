"""The HTTP request and response formats of ``ortfuse serve`` (README, "Serving with Ray").

Requests (``POST``), by ``Content-Type``:
- ``application/json``: ``{"inputs": {NAME: {"dtype": "float32", "shape": [1, 3, 48, 32], "data":
  [...]}}}``; ``data`` is flat (row-major) or nested lists, ``shape`` reshapes it (optional when the
  nesting gives it), ``dtype`` is optional (default the model's; given, it must be the model's).
  ``{"inputs": {NAME: [[...]]}}`` is the short form: nested lists of the model's dtype.
  Numbers only: no float for an integer input, no number for a bool one.
- ``application/x-npz``: numpy's ``.npz`` (``np.savez`` or ``np.savez_compressed``), one array per
  input named as the input; loaded without pickle, its members' declared sizes checked first.
Responses: the request's format, unless ``Accept`` names the other one. JSON: ``{"outputs": {NAME:
{"dtype", "shape", "data"}}}`` with ``data`` flat, row-major (non-finite floats as ``NaN`` /
``Infinity``, as Python's json writes them); npz: one array per output. Errors: ``{"error":
SENTENCE, "retriable": BOOL}`` with a 4xx (the request is wrong: the sentence says what to send) or
a 5xx (retriable: send it again).
"""

from __future__ import annotations

import io
import json
import math
import zipfile

import numpy as np

from ortfuse.foundation.messages import one_sentence
from ortfuse.serve.signature import RequestError, Signature

JSON = "application/json"
NPZ = "application/x-npz"
MAX_JSON_BYTES = 32 << 20  # JSON is for small tensors: beyond this, one parse would hold a replica's ingress
MAX_NPZ_BYTES = 1 << 30  # body, and the sum of the arrays an npz declares


def media_type(header: str | None) -> str:
    """``application/json; charset=utf-8`` -> ``application/json`` ('' when absent)."""
    return (header or "").split(";", 1)[0].strip().lower()


def body_limit(content_type: str | None) -> int:
    """The largest body accepted for ``content_type``; RequestError (415) for a type not served."""
    kind = media_type(content_type)
    if kind == JSON:
        return MAX_JSON_BYTES
    if kind == NPZ:
        return MAX_NPZ_BYTES
    shown = f"Content-Type {kind}" if kind else "no Content-Type"
    raise RequestError(f"{shown} is not served: send {JSON} (small tensors) or {NPZ} (numpy .npz)", 415)


def too_large(size: int, content_type: str | None) -> RequestError:
    hint = f": send large tensors as {NPZ}" if media_type(content_type) == JSON else ""
    return RequestError(f"the request body is {size} bytes, over the limit of {body_limit(content_type)}{hint}", 413)


def decode(body: bytes, content_type: str | None, signature: Signature) -> dict[str, np.ndarray]:
    """The request's input arrays (not yet checked against the model: ``Signature.check``)."""
    if len(body) > body_limit(content_type):
        raise too_large(len(body), content_type)
    if media_type(content_type) == JSON:
        return _decode_json(body, signature)
    return _decode_npz(body)


def response_type(content_type: str | None, accept: str | None) -> str:
    """The response's format: the one ``Accept`` names, else the request's."""
    wanted = {media_type(part) for part in (accept or "").split(",")}
    request = media_type(content_type)
    if request in wanted or not wanted & {JSON, NPZ}:
        return NPZ if request == NPZ else JSON
    return NPZ if NPZ in wanted else JSON


def encode(outputs: dict[str, np.ndarray], kind: str) -> bytes:
    """The response body of ``outputs`` in format ``kind`` (JSON or NPZ)."""
    if kind == NPZ:  # what np.savez writes, without its keyword arguments that an output's name could shadow
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, array in outputs.items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
        return buffer.getvalue()
    return json.dumps({"outputs": {name: {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.ravel().tolist()}
                                   for name, a in outputs.items()}}).encode()


def error_body(message: str, retriable: bool) -> bytes:
    return json.dumps({"error": message, "retriable": retriable}).encode()


def _decode_json(body: bytes, signature: Signature) -> dict[str, np.ndarray]:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not JSON ({one_sentence(exc)}): send {{\"inputs\": {{NAME: {{\"dtype\", "
                           "\"shape\", \"data\"}}}}") from None
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, dict):
        raise RequestError("the JSON body has no \"inputs\" object: send {\"inputs\": {NAME: {\"dtype\", \"shape\", "
                           "\"data\"}}}")
    feeds = {}
    for name, value in inputs.items():
        spec = signature.input(name)
        feeds[name] = _json_tensor(name, value, spec.dtype if spec else None)
    return feeds


def _json_tensor(name: str, value, model_dtype: str | None) -> np.ndarray:
    if isinstance(value, list):
        value = {"data": value}
    if not isinstance(value, dict) or "data" not in value:
        raise RequestError(f"input '{name}' is not an object with \"data\" (and optional \"dtype\", \"shape\") nor a "
                           "list of numbers: send {\"dtype\", \"shape\", \"data\"}")
    dtype = _dtype(name, value.get("dtype"), model_dtype)
    try:
        raw = np.asarray(value["data"])
    except ValueError as exc:  # ragged nesting
        raise RequestError(f"input '{name}': \"data\" is not a rectangular list of numbers ({one_sentence(exc)}): "
                           "send flat data with \"shape\", or equal-length nested lists") from None
    if raw.dtype.kind == "O" and all(isinstance(v, int) and not isinstance(v, bool) for v in raw.ravel()):
        raise RequestError(f"input '{name}': \"data\" does not fit {dtype} (integers beyond 64 bits): send values in "
                           "its range")
    if raw.size and not _kind_fits(raw.dtype.kind, dtype.kind):
        got = {"b": "booleans", "f": "non-integer numbers"}.get(raw.dtype.kind, "values that are not numbers")
        raise RequestError(f"input '{name}' is {dtype} but \"data\" holds {got}: send {_values_of(dtype)}")
    try:
        array = raw.astype(dtype, casting="unsafe") if raw.size else np.zeros(raw.shape, dtype)
        if dtype.kind in "iu" and raw.size and not np.array_equal(array, raw):
            raise OverflowError(f"out of range of {dtype}")
    except (OverflowError, ValueError, TypeError) as exc:
        raise RequestError(f"input '{name}': \"data\" does not fit {dtype} ({one_sentence(exc)}): send values in its "
                           "range") from None
    shape = value.get("shape")
    if shape is None:
        return array
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise RequestError(f"input '{name}': \"shape\" {shape!r} is not a list of non-negative integers: send e.g. "
                           "[1, 3, 224, 224]")
    if math.prod(shape) != array.size:
        raise RequestError(f"input '{name}': \"shape\" {shape} holds {math.prod(shape)} values but \"data\" has "
                           f"{array.size}: send data of that many values, or the shape of the data")
    return array.reshape(shape)


def _dtype(name: str, given, model_dtype: str | None) -> np.dtype:
    if given is None:
        return np.dtype(model_dtype or "float32")
    try:
        dtype = np.dtype(given) if isinstance(given, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        raise RequestError(f"input '{name}': \"dtype\" {given!r} is not a numeric or bool dtype name: send e.g. "
                           f"\"{model_dtype or 'float32'}\"")
    return dtype


def _kind_fits(data_kind: str, target_kind: str) -> bool:
    """JSON numbers of kind ``data_kind`` (numpy's: b, i, u, f) taken as ``target_kind`` without loss of meaning."""
    if target_kind == "b":
        return data_kind == "b"
    if target_kind in "iu":
        return data_kind in "iu"
    return data_kind in "iuf"


def _values_of(dtype: np.dtype) -> str:
    return {"b": "true/false", "i": "integers", "u": "non-negative integers"}.get(dtype.kind, "numbers")


def _decode_npz(body: bytes) -> dict[str, np.ndarray]:
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as exc:
        raise RequestError(f"the body is not an .npz file ({one_sentence(exc)}): send the bytes np.savez writes"
                           ) from None
    declared = sum(m.file_size for m in members)
    if declared > MAX_NPZ_BYTES:
        raise RequestError(f"the .npz declares {declared} bytes of arrays, over the limit of {MAX_NPZ_BYTES}: send "
                           "fewer or smaller tensors per request", 413)
    bad = [m.filename for m in members if not m.filename.endswith(".npy")]
    if bad:
        raise RequestError(f"the .npz holds {bad[0]!r}, which is not a .npy array: send only the arrays np.savez "
                           "writes, one per input")
    feeds = {}
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as npz:
            for name in npz.files:
                feeds[name] = npz[name]
    except Exception as exc:  # numpy raises ValueError, OSError, zipfile and zlib errors for broken members
        raise RequestError(f"an array of the .npz cannot be read ({one_sentence(exc)}): send numeric arrays written "
                           "by np.savez, without pickled objects") from None
    return feeds

