"""Attributes of a native op: the descriptor table its record points at (built in Python from its
``AttrDef``s) and reading the node's attributes into the kernel-state slot in ``CreateKernelV2`` (numba).

Kinds: ``float`` (stored as float64), ``int`` (int64) and ``choice``: a string attribute read once
and stored as codes, e.g. ``activation="relu+gelu"`` with choices ``("relu", "gelu", ...)`` becomes
``[2, 0, 1]`` (count, then the index of each ``+``-joined token). ``ints`` / ``floats`` (ONNX INTS /
FLOATS, ``KernelInfoGetAttributeArray_*``) are stored the same way: the count, then each value (int64,
or float64 for floats), at most ``max_steps`` of them. A missing required attribute or a bad value is
an error status naming what is accepted (session creation fails with it). Provenance attributes
(``pattern_id``, ``replaced_nodes``) are never read.
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np
from numba import njit

from ortfuse.custom_ops.abi import ORT_INVALID_ARGUMENT
from ortfuse.custom_ops.intrinsics import load_f32, load_i64, load_u8, stack_bytes, store_f64, store_i64
from ortfuse.custom_ops.native.op_def import AttrDef
from ortfuse.custom_ops.native.words import (
    AD_CHOICES,
    AD_DEFAULT,
    AD_KIND,
    AD_MAX_STEPS,
    AD_N_CHOICES,
    AD_NAME,
    AD_REQUIRED,
    AD_SLOT,
    ATTR_BASE,
    ATTR_KINDS,
    ATTR_WORDS,
    EXT,
    EXT_ATTRS,
    EXT_N_ATTRS,
    EXT_NAME,
    KIND_FLOAT,
    KIND_FLOATS,
    KIND_INT,
    KIND_INTS,
    MSG_CAP,
    STRING_ATTR_CAP,
)
from ortfuse.custom_ops.ort_api import (
    kernel_info_get_float,
    kernel_info_get_floats,
    kernel_info_get_int64,
    kernel_info_get_ints,
    kernel_info_get_string,
    release_status,
)
from ortfuse.custom_ops.status_messages import cstr, msg_put, msg_put_cstr, msg_put_int, msg_status

_T_COLON = cstr(": ")
_T_ATTR = cstr("attribute '")
_T_MISSING = cstr("' is required and missing")
_T_TOO_LONG = cstr("' is longer than 255 bytes")
_T_BAD_CHOICE = cstr("' has unsupported value '")
_T_EXPECTED_ONE_OF = cstr("'; expected '+'-joined tokens from: ")
_T_TOO_MANY = cstr("' has more '+'-joined steps than ")
_T_TOO_MANY_VALUES = cstr("' has more values than ")
_T_COMMA = cstr(", ")


class AttributeTable:
    """The descriptor table of an op's attributes (``ATTR_WORDS`` int64 words each) and the C strings
    it points at (names, choices); the record points at ``address``. Kept as long as the record."""

    def __init__(self, attrs: tuple[AttrDef, ...]):
        self.names = [ctypes.create_string_buffer(a.name.encode()) for a in attrs]
        self.choice_strings = []
        self.choice_tables = []
        self.table = (ctypes.c_int64 * max(1, ATTR_WORDS * len(attrs)))()
        for i, a in enumerate(attrs):
            choices = None
            if a.kind == "choice":
                strings = [ctypes.create_string_buffer(c.encode()) for c in a.choices]
                choices = (ctypes.c_int64 * max(1, len(strings)))(*[ctypes.addressof(s) for s in strings])
                self.choice_strings.append(strings)
                self.choice_tables.append(choices)
            default = (struct.unpack("<q", struct.pack("<d", float(a.default)))[0] if a.kind == "float"
                       else int(a.default) if a.kind == "int" else 0)
            values = {AD_NAME: ctypes.addressof(self.names[i]),
                      AD_KIND: ATTR_KINDS[a.kind],
                      AD_SLOT: a.slot, AD_REQUIRED: int(a.required), AD_DEFAULT: default,
                      AD_CHOICES: ctypes.addressof(choices) if choices is not None else 0,
                      AD_N_CHOICES: len(a.choices), AD_MAX_STEPS: a.max_steps}
            for k, v in values.items():
                self.table[ATTR_WORDS * i + k] = v

    @property
    def address(self) -> int:
        return ctypes.addressof(self.table)


@njit(cache=True)
def _token_matches(choice, start, end, text):
    """Does the C string at ``choice`` equal bytes [start, end) of the buffer at ``text``?"""
    i = 0
    while True:
        c = load_u8(choice + i)
        if start + i == end:
            return c == 0
        if c == 0 or c != load_u8(text + start + i):
            return False
        i += 1


@njit(cache=True)
def _attr_error(api, op, desc, text, extra_addr, extra_choices):
    buf = stack_bytes(MSG_CAP)
    n = msg_put_cstr(buf, MSG_CAP, 0, load_i64(op + EXT + 8 * EXT_NAME))
    n = msg_put(buf, MSG_CAP, n, _T_COLON)
    n = msg_put(buf, MSG_CAP, n, _T_ATTR)
    n = msg_put_cstr(buf, MSG_CAP, n, load_i64(desc + 8 * AD_NAME))
    n = msg_put(buf, MSG_CAP, n, text)
    if extra_addr != 0:
        n = msg_put_cstr(buf, MSG_CAP, n, extra_addr)
    if extra_choices:
        n = msg_put(buf, MSG_CAP, n, _T_EXPECTED_ONE_OF)
        choices = load_i64(desc + 8 * AD_CHOICES)
        for k in range(load_i64(desc + 8 * AD_N_CHOICES)):
            if k > 0:
                n = msg_put(buf, MSG_CAP, n, _T_COMMA)
            n = msg_put_cstr(buf, MSG_CAP, n, load_i64(choices + 8 * k))
    return msg_status(api, ORT_INVALID_ARGUMENT, buf, n)


@njit(cache=True)
def read_attrs(op, api, info, slot):
    """Read every described attribute of the node into the slot; returns 0 or an error status."""
    tmp = stack_bytes(16)
    text = stack_bytes(STRING_ATTR_CAP)
    table = load_i64(op + EXT + 8 * EXT_ATTRS)
    for a in range(load_i64(op + EXT + 8 * EXT_N_ATTRS)):
        desc = table + 8 * ATTR_WORDS * a
        name = load_i64(desc + 8 * AD_NAME)
        kind = load_i64(desc + 8 * AD_KIND)
        word = slot + 8 * (ATTR_BASE + load_i64(desc + 8 * AD_SLOT))
        required = load_i64(desc + 8 * AD_REQUIRED) != 0
        store_i64(tmp, 0)
        if kind == KIND_FLOAT:
            st = kernel_info_get_float(api, info, name, tmp)
            if st == 0:
                store_f64(word, np.float64(load_f32(tmp)))
        elif kind == KIND_INT:
            st = kernel_info_get_int64(api, info, name, tmp)
            if st == 0:
                store_i64(word, load_i64(tmp))
        elif kind in (KIND_INTS, KIND_FLOATS):
            st = _read_array_attr(api, info, name, kind, load_i64(desc + 8 * AD_MAX_STEPS), word, tmp, text)
            if st != 0 and load_i64(tmp) > load_i64(desc + 8 * AD_MAX_STEPS):
                release_status(api, st)
                buf = stack_bytes(32)
                msg_put_int(buf, 32, 0, load_i64(desc + 8 * AD_MAX_STEPS))
                return _attr_error(api, op, desc, _T_TOO_MANY_VALUES, buf, False)
        else:
            store_i64(tmp, STRING_ATTR_CAP)
            st = kernel_info_get_string(api, info, name, text, tmp)
            if st == 0:
                length = load_i64(tmp) - 1  # ORT reports the size with the NUL
                choices = load_i64(desc + 8 * AD_CHOICES)
                n_choices = load_i64(desc + 8 * AD_N_CHOICES)
                max_steps = load_i64(desc + 8 * AD_MAX_STEPS)
                steps = 0
                start = 0
                while start < length:
                    end = start
                    while end < length and load_u8(text + end) != 43:  # '+'
                        end += 1
                    code = -1
                    for k in range(n_choices):
                        if _token_matches(load_i64(choices + 8 * k), start, end, text):
                            code = k
                            break
                    if code < 0:
                        return _attr_error(api, op, desc, _T_BAD_CHOICE, text, True)
                    if steps >= max_steps:
                        buf = stack_bytes(32)
                        msg_put_int(buf, 32, 0, max_steps)
                        return _attr_error(api, op, desc, _T_TOO_MANY, buf, False)
                    store_i64(word + 8 * (1 + steps), code)
                    steps += 1
                    start = end + 1
                store_i64(word, steps)
            elif load_i64(tmp) > STRING_ATTR_CAP:
                release_status(api, st)
                return _attr_error(api, op, desc, _T_TOO_LONG, 0, False)
        if st != 0:
            release_status(api, st)
            if required:
                return _attr_error(api, op, desc, _T_MISSING, 0, False)
            # optional and absent: the default (float defaults are stored as float64 bits; a
            # missing 'choice', 'ints' or 'floats' is zero values)
            store_i64(word, load_i64(desc + 8 * AD_DEFAULT) if kind in (KIND_FLOAT, KIND_INT) else 0)
    return 0


@njit(cache=True)
def _read_array_attr(api, info, name, kind, cap, word, size_addr, buf):
    """Read an INTS/FLOATS attribute of at most ``cap`` values into ``word`` (count, then values;
    floats widened to float64) through ``buf`` (STRING_ATTR_CAP bytes); returns 0 or ORT's status,
    with the attribute's true length at ``size_addr`` when it did not fit."""
    store_i64(size_addr, cap)
    if kind == KIND_INTS:
        st = kernel_info_get_ints(api, info, name, buf, size_addr)
    else:
        st = kernel_info_get_floats(api, info, name, buf, size_addr)
    if st != 0:
        return st
    count = min(load_i64(size_addr), cap)  # ORT succeeds only when the values fit; never write past them
    for i in range(count):
        if kind == KIND_INTS:
            store_i64(word + 8 * (1 + i), load_i64(buf + 8 * i))
        else:
            store_f64(word + 8 * (1 + i), np.float64(load_f32(buf + 4 * i)))
    store_i64(word, count)
    return 0
