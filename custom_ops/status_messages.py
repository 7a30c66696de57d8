"""Error messages built inside numba code: C strings as compile-time constants (``cstr``), appending
text, C strings, integers and dims to a stack buffer (``msg_put*``), and wrapping the message in an
``OrtStatus`` (``msg_status``): a status reaches Python as an exception with this text."""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import load_i64, load_u8, store_u8
from ortfuse.custom_ops.ort_api import create_status


def cstr(text: str) -> np.ndarray:
    """A NUL-free uint8 array for message text; as a module global it is a numba compile-time constant."""
    data = text.encode("utf-8")
    if b"\0" in data:
        raise ValueError("message text must not contain NUL")
    return np.frombuffer(data, dtype=np.uint8).copy()


@njit(cache=True)
def msg_put(buf, cap, n, text):
    """Append the bytes of ``text`` (a uint8 array) to the message at address ``buf``; returns the new length."""
    for i in range(text.shape[0]):
        if n >= cap - 1:
            break
        store_u8(buf + n, text[i])
        n += 1
    return n


@njit(cache=True)
def msg_put_cstr(buf, cap, n, addr):
    """Append a NUL-terminated C string at ``addr``."""
    if addr == 0:
        return n
    i = 0
    while n < cap - 1:
        c = load_u8(addr + i)
        if c == 0:
            break
        store_u8(buf + n, c)
        n += 1
        i += 1
    return n


@njit(cache=True)
def msg_put_int(buf, cap, n, value):
    """Append a decimal integer."""
    v = np.int64(value)
    if v < 0:
        if n < cap - 1:
            store_u8(buf + n, 45)  # '-'
            n += 1
        v = -v
    p = np.int64(1)
    while p <= v // 10:
        p *= 10
    while p > 0 and n < cap - 1:
        store_u8(buf + n, 48 + (v // p) % 10)
        n += 1
        p //= 10
    return n


@njit(cache=True)
def msg_put_dims(buf, cap, n, dims_addr, rank):
    """Append ``[d0,d1,...]`` from ``rank`` int64 values at ``dims_addr``."""
    if n < cap - 1:
        store_u8(buf + n, 91)  # '['
        n += 1
    for i in range(rank):
        if i > 0 and n < cap - 1:
            store_u8(buf + n, 44)  # ','
            n += 1
        n = msg_put_int(buf, cap, n, load_i64(dims_addr + 8 * i))
    if n < cap - 1:
        store_u8(buf + n, 93)  # ']'
        n += 1
    return n


@njit(cache=True)
def msg_status(api, code, buf, n):
    """NUL-terminate the message at ``buf`` and wrap it in a new OrtStatus (ORT copies the text)."""
    store_u8(buf + n, 0)
    return create_status(api, code, buf)
