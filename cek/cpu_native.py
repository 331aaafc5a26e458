"""cpu_native.cpp built for this machine with g++, cached by content, loaded with ctypes.

cek.cpu calls `rows_function(name)` with the kernels' dtype name (f16, bf16, f32, f64: bfloat16
comes as uint16 bits); None means "use NumPy": no g++ on PATH, a build that
failed, a cache folder that cannot be written, a cached library that lacks the functions, or
CEK_CPU_NATIVE=0 in the environment. A cached library is loaded only where cek.cache trusts it
(the user's alone); else it is built in a private folder of the process. The
compiled rows are bitwise those of the NumPy code, so which one ran changes no result, only
the time (docs/cpu.md). `unavailable_reason()` says why NumPy is used.

The first call that builds the library (a second or more of g++) says so in one line on stderr,
naming the cache folder; a call that loads it from the cache says nothing.

The library is built with -march=native: it runs the vector instructions this CPU has. The
cache key holds the compiler's predefined macros under that flag, which name every instruction
set it enables, so a cache folder shared with a different CPU never hands it a library it
cannot run.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "cpu_native.cpp"
FLAGS = ("-std=c++20", "-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno",
         "-fPIC", "-shared", "-pthread", "-fvisibility=hidden", "-fdiagnostics-color=never")
_ACC = {"f16": ctypes.c_float, "bf16": ctypes.c_float, "f32": ctypes.c_float,
        "f64": ctypes.c_double}
_why_not: list[str] = []


def enabled() -> bool:
    return os.environ.get("CEK_CPU_NATIVE", "1") != "0"


def rows_function(name: str):
    """The compiled `cek_cpu_rows_<name>`, or None when the NumPy code must run. Its last
    argument is the number of threads to split the rows over."""
    if not enabled():
        return None
    library = _library()
    if library is None:
        return None
    function = library[f"cek_cpu_rows_{name}"]
    acc, pointer, size = _ACC[name], ctypes.c_void_p, ctypes.c_int64
    function.argtypes = [pointer, pointer, size, size, pointer, acc, acc, pointer, size,
                         pointer, pointer, pointer, pointer, pointer, size]
    function.restype = None
    return function


def unavailable_reason() -> str | None:
    """Why the NumPy code runs instead of the compiled rows, or None if it does not."""
    if not enabled():
        return "CEK_CPU_NATIVE=0"
    _library()
    return _why_not[0] if _why_not else None


@functools.lru_cache(maxsize=None)
def _library():
    from cek import cache
    from cek.compile import CompileError
    from cek.emulate import build
    from cek.emulate.errors import CacheDirError

    try:
        key = build._digest(SOURCE.read_bytes(), *FLAGS, build.compiler_version(),
                            _native_macros())
        target = build.cache_dir() / "cpu" / f"rows-{key[:16]}.so"

        def compile_into(tmp: Path) -> Path:
            _say_building(tmp.parent)  # only when no good copy is found; tmp is in its folder
            out = tmp / "rows.so"
            build._run([build.CXX, *FLAGS, str(SOURCE), "-o", str(out)], "cek/cpu_native.cpp",
                       tmp)
            return out

        path = build._build_once(target, compile_into)
        names = [f"cek_cpu_rows_{name}" for name in _ACC]
        missing = cache.missing_symbols(path, names)
        if missing:  # a library of the user's own, in the cache under this name
            raise RuntimeError(f"{path} lacks {', '.join(missing)}: remove it and cek builds it "
                               "again")
        library = ctypes.CDLL(str(path))
        return {name: getattr(library, name) for name in names}
    except (RuntimeError, CompileError, CacheDirError, OSError, subprocess.SubprocessError,
            AttributeError) as exc:  # AttributeError: a function missing on a non-ELF system
        _why_not.append(f"{type(exc).__name__}: {exc}")
        return None


def _say_building(folder: Path) -> None:
    """One line on stderr: a first call that waits on g++ says why, and where the library goes.
    Never stdout, which is the calling program's; a closed stderr (or none, under pythonw) costs
    the line, not the build."""
    from cek.emulate import build

    if sys.stderr is None:
        return
    try:
        print(f"cek: building cek/cpu_native.cpp with {build.CXX} for this CPU, once "
              f"(cached in {folder})", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _native_macros() -> str:
    """g++'s predefined macros under -march=native: the instruction sets it will use."""
    from cek.emulate import build

    done = subprocess.run([build.CXX, "-march=native", "-dM", "-E", "-x", "c++", "-"],
                          input="", capture_output=True, text=True, check=True)
    return done.stdout
