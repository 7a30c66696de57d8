"""One native op's record: the ``OrtCustomOp`` struct ORT reads, followed by the extension words the
shared callbacks read through the ``const OrtCustomOp*`` (name, counts, types, attribute table,
pool, worker), with the C strings and tables they point at. Kept for the process lifetime."""

from __future__ import annotations

import ctypes

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.native.attributes import AttributeTable
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.native.words import (
    EXT_ATTRS,
    EXT_INPUT_TYPE,
    EXT_MAGIC,
    EXT_N_ATTRS,
    EXT_N_INPUTS,
    EXT_N_OUTPUTS,
    EXT_NAME,
    EXT_OP_ID,
    EXT_OUTPUT_TYPE,
    EXT_POOL,
    EXT_WORDS,
    EXT_WORKER,
    RECORD_MAGIC,
)


class _Record(ctypes.Structure):
    _fields_ = [("op", abi.OrtCustomOp), ("ext", ctypes.c_int64 * EXT_WORDS)]


class OpRecord:
    """Everything ORT or extensions may point at for one op: the record, its name, its attribute
    table and its compiled compute and worker."""

    def __init__(self, op_def: NativeOpDef, op_id: int, pool_addr: int, callbacks: dict, compute, worker):
        self.op_def = op_def
        self.compute = compute
        self.worker = worker
        self.name = ctypes.create_string_buffer(op_def.name.encode())
        self.attributes = AttributeTable(op_def.attrs)
        rec = _Record()
        rec.op.version = abi.OP_STRUCT_VERSION
        for field, addr in callbacks.items():
            setattr(rec.op, field, addr)
        rec.op.KernelComputeV2 = compute.address
        ext = {EXT_MAGIC: RECORD_MAGIC, EXT_NAME: ctypes.addressof(self.name),
               EXT_N_INPUTS: len(op_def.inputs), EXT_N_OUTPUTS: op_def.n_outputs,
               EXT_INPUT_TYPE: op_def.input_type, EXT_OUTPUT_TYPE: op_def.output_type,
               EXT_POOL: pool_addr, EXT_N_ATTRS: len(op_def.attrs),
               EXT_ATTRS: self.attributes.address, EXT_OP_ID: op_id,
               EXT_WORKER: worker.address if worker is not None else 0}
        for k, v in ext.items():
            rec.ext[k] = v
        self.record = rec

    @property
    def address(self) -> int:
        return ctypes.addressof(self.record)
