"""The native custom-op runtime: numba cfuncs in ctypes ``OrtCustomOp`` records, added to
onnxruntime-extensions with ``AddExternalCustomOp`` so that they land in domain ``ai.onnx.contrib``
(docs/ARCHITECTURE.md §6). This file imports nothing; import the module you need:

* ``words``: the int64 word layouts every part reads (record extension words, attribute
  descriptors, kernel-state slots, the pool block) and the limits (``MAX_RANK``...). No numba.
* ``extensions``: onnxruntime-extensions' shared library (its path, its ``AddExternalCustomOp``). No numba.
* ``availability``: why native ops cannot run in this process (``ORTFUSE_NATIVE``, platform, ORT
  API version, extensions). No numba.
* ``op_def``: ``NativeOpDef`` and ``AttrDef``, what an op family declares. No numba.
* ``pool``: the process's pool block and the run-time threading settings kept in it. No numba.
* ``slots``: the kernel-state pool (a free list of slots that grows with malloc, never shrinks) and
  reading a live slot.
* ``attributes``: the attribute descriptor table of an op, and reading the node's attributes into
  its slot in ``CreateKernelV2``.
* ``inputs``: reading and checking inputs, allocating outputs, one-sentence error statuses.
* ``threads``: ``run_blocks`` (serial, ORT's intra-op pool or numba's threads) and ``set_threading``.
* ``callbacks``: the callbacks all ops share: ``CreateKernelV2``/``KernelDestroy`` (numba) and the
  metadata callbacks (LLVM IR stubs).
* ``lifetime``: keeping what ORT points at alive for the process; the memo of compiled cfuncs.
* ``records``: one op's ``OrtCustomOp`` record (struct, extension words, C strings, attribute table).
* ``install``: ``ensure_registered(op_defs)``: compile and add ops to onnxruntime-extensions, once.
* ``elementwise``, ``broadcast``, ``reductions``: machinery the op families share (unary computes in
  blocks with cache hints; two inputs with numpy broadcasting; row sums of the normalization kernels).
* ``ops``: the native op families, one module each (contract in its docstring).

What ORT holds pointers to lives until the process exits: per op a *record* (the ``OrtCustomOp``
followed by extension words the shared callbacks read through the ``const OrtCustomOp*``), a *pool*
block (spin lock, free list of kernel-state slots, counters, threading settings) and kernel *slots*
made in ``CreateKernelV2`` (ORT's ``void* kernel``: the ``const OrtApi*``, the record and the
attribute values). ``KernelComputeV2`` is shared by the ops of one family; what differs per op is
its *worker*, a ``void(void* args, size_t block)`` cfunc that does the math on one block.
"""
