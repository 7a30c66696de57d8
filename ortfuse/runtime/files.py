"""Writing a file so that readers see the old content or the new one, never a partial write."""

from __future__ import annotations

import contextlib
import os
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
