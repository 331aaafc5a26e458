"""The sanitized child of `sanitize.launch`: reads a launch on stdin, writes the arrays back.

Each array gets its own buffer from posix_memalign, which under LD_PRELOAD is the sanitizer's
allocator: a buffer of exactly the array's bytes (plus the original address modulo 256 in
front), so one element past the end is outside it.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import sys

if __package__:
    from cek.emulate.runner import Library, arg_values
else:  # run as a script (see sanitize.py), without importing cek: runner.py lies beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from runner import Library, arg_values


def main() -> None:
    job = pickle.load(sys.stdin.buffer)
    libc = ctypes.CDLL(None)
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                    ctypes.c_size_t]
    buffers, values = [], []
    for arg in job["args"]:
        if arg[0] != "array":
            values.append(arg[1])
            continue
        data, misalignment = arg[1], arg[2]
        base = ctypes.c_void_p()
        if libc.posix_memalign(ctypes.byref(base), 256, misalignment + len(data)) != 0:
            raise MemoryError(f"cannot allocate {len(data)} bytes")
        address = base.value + misalignment
        ctypes.memmove(address, data, len(data))
        buffers.append((address, len(data)))
        values.append(address)
    library = Library(job["library"])
    error = library.launch(job["grid"], job["block"], arg_values(job["ctypes"], values),
                           job["shared_mem"], job["schedule"], 0)
    result = {"error": error, "arrays": [ctypes.string_at(a, n) for a, n in buffers]}
    sys.stdout.buffer.write(pickle.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
