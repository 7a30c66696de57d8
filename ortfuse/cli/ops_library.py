"""``ortfuse ops-library``: build this machine's ahead-of-time ops library (if missing) and print its
path, for ``SessionOptions.register_custom_ops_library`` in any ORT host (docs/ARCHITECTURE.md §6b).

    ortfuse ops-library                 # build once per machine and version, print the path
    ortfuse ops-library --rebuild       # build again
    ortfuse ops-library --isa generic --out libortfuse_ops.so   # for other machines of that level
"""

from __future__ import annotations

import json
import sys
import time


def add_arguments(p) -> None:
    p.add_argument("--rebuild", action="store_true", help="build even if the library exists")
    p.add_argument("--isa", help="ISA level to build for (default: this machine's); with --out")
    p.add_argument("--out", help="write the library here instead of the cache (with --isa, any level)")
    p.add_argument("--json", action="store_true", help="print the path and the build summary as JSON")


def run(args) -> int:
    from ortfuse.custom_ops.aot import library

    t0 = time.perf_counter()
    summary = None
    try:
        if args.out or args.isa or args.rebuild:
            if args.isa and not args.out and args.isa != library.level():
                print(f"ortfuse: --isa {args.isa} differs from this machine's level ({library.level()}): "
                      "give --out for a library to deploy elsewhere", file=sys.stderr)
                return 2
            summary = library.build(args.out, args.isa)
            path = args.out or str(library.default_path(args.isa))
        else:
            path = str(library.library_path())
    except library.LibraryError as exc:
        print(f"ortfuse: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"path": path, "seconds": round(time.perf_counter() - t0, 1), "build": summary}))
    else:
        print(path)
    return 0
