"""Word layouts the native runtime and its ops agree on (int64 words at known offsets), and limits.

* record: the ``OrtCustomOp`` then ``EXT_WORDS`` extension words at byte offset ``EXT``;
* attribute descriptor: ``ATTR_WORDS`` words per attribute of an op, in a table the record points at;
* kernel-state slot: ``SLOT_WORDS`` words (state, ``const OrtApi*``, record, pool, one owned buffer,
  then attribute values from ``ATTR_BASE``);
* pool block: lock, free list, counters and the run-time threading settings.

No numba: importable to read a limit such as ``MAX_RANK`` without compiling anything.
"""

from __future__ import annotations

from ortfuse.custom_ops import abi

EXT = abi.OP_STRUCT_SIZE          # byte offset of the extension words behind the OrtCustomOp
EXT_MAGIC, EXT_NAME, EXT_N_INPUTS, EXT_N_OUTPUTS, EXT_INPUT_TYPE, EXT_OUTPUT_TYPE = 0, 1, 2, 3, 4, 5
EXT_POOL, EXT_N_ATTRS, EXT_ATTRS, EXT_OP_ID, EXT_WORKER = 6, 7, 8, 9, 10
EXT_WORDS = 16
RECORD_MAGIC = 0x4F52544655534531  # "ORTFUSE1"

# attribute descriptor: one per attribute, ATTR_WORDS words each
AD_NAME, AD_KIND, AD_SLOT, AD_REQUIRED, AD_DEFAULT, AD_CHOICES, AD_N_CHOICES, AD_MAX_STEPS = range(8)
ATTR_WORDS = 8
KIND_FLOAT, KIND_INT, KIND_CHOICE, KIND_INTS, KIND_FLOATS = 0, 1, 2, 3, 4
ATTR_KINDS = {"float": KIND_FLOAT, "int": KIND_INT, "choice": KIND_CHOICE, "ints": KIND_INTS, "floats": KIND_FLOATS}

# kernel state slot
SLOT_WORDS = 64
SLOT_BYTES = 8 * SLOT_WORDS
S_STATE, S_API, S_RECORD, S_POOL = 0, 1, 2, 3
S_OWNED = 4                        # a malloc'd buffer the kernel keeps (packed weights); KernelDestroy frees it
ATTR_BASE = 8                      # first word of attribute values
MAX_ATTR_WORDS = SLOT_WORDS - ATTR_BASE
SLOT_LIVE = 0x4B45524E454C4C56     # "KERNELLV": a live slot's state word

# pool block
P_LOCK, P_FREE, P_LIVE, P_ALLOCATED, P_PEAK, P_CREATES, P_DESTROYS, P_ALLOC_FAIL = range(8)
P_PAR_MIN, P_THREADING, P_PAR_FOR = 8, 9, 10   # run-time threading settings (threads.set_threading)
POOL_WORDS = 16
THREADS_SERIAL, THREADS_ORT, THREADS_NUMBA = 0, 1, 2
THREADING_MODES = {"serial": THREADS_SERIAL, "ort": THREADS_ORT, "numba": THREADS_NUMBA}

MAX_RANK = 12                      # inputs of higher rank fail the run (inputs.check_float_input)
DIMS_BYTES = 8 * MAX_RANK          # one dims buffer (stack_bytes needs a constant, not an expression)
STRING_ATTR_CAP = 256
MSG_CAP = 512
