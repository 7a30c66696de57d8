"""Files ortfuse writes: atomically (readers see the old content or the new one, never a partial
write); models handed to ORT as a path, and read as bytes without a copy."""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import uuid
from pathlib import Path


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` (str: UTF-8) to a unique temporary file beside ``path``, then ``os.replace`` it
    into place. The temporary file is removed if anything fails; the folder must exist."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:  # unlike mkstemp, honours the umask
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def model_file(source: str | bytes):
    """A file path ORT can load ``source`` from: the path itself, or the bytes written to a temporary
    file (removed after). ORT parses a model handed over as bytes while holding the GIL, for tens
    of milliseconds on a few-MB model, which served runs of this process would wait for; it reads a
    path with the GIL released (``tools/swap_gil_probe.py`` measures both)."""
    if isinstance(source, str):
        yield source
        return
    with tempfile.TemporaryDirectory(prefix="ortfuse-swap-") as folder:
        path = os.path.join(folder, "plan.onnx")
        with open(path, "wb") as fh:
            fh.write(source)
        yield path


@contextlib.contextmanager
def model_bytes(source: str | bytes):
    """The serialized model as a buffer (bytes, or a read-only mmap of the file), or None when the
    file cannot be read or mapped."""
    if isinstance(source, bytes):
        yield source
        return
    try:
        fh = open(source, "rb")  # noqa: SIM115 - closed below, after the map
    except OSError:
        yield None
        return
    try:
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield data
    except (OSError, ValueError):  # empty or unmappable: the parsed path reports it
        yield None
    finally:
        fh.close()
