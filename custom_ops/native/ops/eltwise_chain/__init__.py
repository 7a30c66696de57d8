"""``FusedEltwiseChain{k}``: the steps of an elementwise program applied to X (with operands
C0..C{k-1}) in one pass over memory. Modules: ``encoding`` (the node's attributes), ``steps`` (the
math of one step on a chunk), ``walk`` (broadcast plan, chunks, blocks, the worker), ``compute``.

Encoding. When the rewriter picks this kernel it adds, beside ``program`` (JSON, kept for the
reference path and for readers) and the provenance attributes, three attributes made by
``encoding.node_attrs`` and read once in CreateKernelV2:

* ``chain_ops`` (ints), one per step: the index of the step's op in ``CHAIN_OPS``;
* ``chain_args`` (ints), one per step: -1 for a unary op, ``2 k`` for ``op(x, Ck)``, ``2 k + 1``
  for ``op(Ck, x)``;
* ``chain_params`` (floats), two per step: LeakyRelu (alpha, 0), Clip (min, max), HardSigmoid
  (alpha, beta), else (0, 0).

A program longer than ``MAX_STEPS`` (or with a step the kernel lacks, such as ``x op x``) is
refused by ``node_attrs``; the registry then picks the reference kernel for that match.

Shapes. The output is the numpy broadcast of X and of every operand a step uses: elementwise steps
commute with broadcasting, so each output element is the program applied to the elements broadcast
to it, and this is the shape the reference and ORT's unfused ops give. The running shape is
broadcast with each operand in step order; the first pair that does not broadcast fails the run with
``ORT_FAIL`` (the class stock ORT's Add/Mul/Pow/Max... raise) and names both shapes. Operands no
step uses are not read.

Walk. The broadcast is collapsed into dims where each input either follows the output (stride) or
repeats (stride 0). The output is cut into blocks of ``BLOCK`` elements (``threads.run_blocks``:
serial, ORT's pool or numba's) and each block into chunks of at most ``CHUNK`` elements (L1): the
first step reads X (and its operand) and writes the output chunk, then every later step runs in
place on it, so X and the output pass through memory once whatever the chain length, and a chain
of s steps makes s passes over the chunk, as s single ops would make over their tensors. The first
polynomial step of a chunk hints the next chunk of its block into the cache while it computes
(``steps.prefetch_ahead``; tensors of at least ``elementwise.HINT_MIN`` elements), so that memory
stays busy during the math. Unary Sigmoid/Tanh/Exp/Erf/Softplus as the first step copy X into the
chunk first (their math dwarfs that pass). In a chunk each input is a slice of its buffer, one
repeated element, or (innermost dim shorter than ``ROW_MIN`` and the input neither follows nor
repeats over the chunk) its elements gathered into a stack buffer. Chunks never cross a row when the
innermost dim has at least ``ROW_MIN`` elements, so then nothing is gathered.

Math: see ``steps``.
"""

from __future__ import annotations


def __getattr__(name: str):
    """``NATIVE_OPS``, made on first access: importing ``encoding`` alone (planning a model with the
    ops library) then imports no numba code."""
    if name != "NATIVE_OPS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ortfuse.custom_ops.native.op_def import NativeOpDef
    from ortfuse.custom_ops.native.ops.eltwise_chain.compute import compute_chain
    from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import CHAIN_ATTRS, node_attrs
    from ortfuse.custom_ops.native.ops.eltwise_chain.walk import chain_worker
    from ortfuse.custom_ops.specs import MAX_CHAIN_OPERANDS

    ops = tuple(
        NativeOpDef(f"FusedEltwiseChain{k}", ("X",) + tuple(f"C{i}" for i in range(k)), compute_chain,
                    chain_worker, attrs=CHAIN_ATTRS, node_attrs=node_attrs)
        for k in range(MAX_CHAIN_OPERANDS + 1)
    )
    globals()["NATIVE_OPS"] = ops
    return ops
