"""The ahead-of-time ops library: every native op compiled once per machine and version into a shared
library that ORT loads, so that a fused session needs neither numba nor LLVM (docs/ARCHITECTURE.md §6b).

* ``library`` (run time, no numba): where the library lives, building it in a child process,
  loading it and handing its records to the native runtime;
* ``build`` (a child process): the units, the objects (in worker processes), the glue, the link;
* ``objects`` (numba, build side): one object file of C entry points for one ISA level;
* ``glue``: the C source of the records, the pool, the metadata callbacks and ``RegisterCustomOps``;
* ``toolchain``: the C compiler that links it.
"""
