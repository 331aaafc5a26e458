"""Build a kernel into a shared library for the emulator, with g++, cached on disk by content.

A library is three parts linked together: the kernel's `source`, compiled unmodified with
prelude.h force-included (a line directive before the generated entry point names it); a
generated translation unit that calls the `extern "C"` entry point from a `void**` argument
array and defines the dynamic shared memory; and runtime.cpp (in the
traffic flavour traffic.cpp, which includes it), compiled once per flavour into its own cached
object. Files are written under a temporary name and moved into place with `os.replace`, so two
processes building the same library at once both succeed.

A cached file is trusted only beside its checksum (`<file>.sha256`, written last, atomically):
loading a truncated or garbled library would crash the process (a bus error, SIGILL), so a file
whose checksum is missing or wrong is rebuilt. The checksum guards against a torn write, not
against another writer: a file is loaded only where cek.cache trusts it (the user's alone), else
it is built in a private folder of the process. A `.build-*` folder that a killed build left
behind is removed by the next build: at once where its name says it was this host's and its
process is gone, else once it is an hour old (a cache folder may be shared between hosts).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from cek import cache
from cek.compile import CompileError
from cek.emulate.errors import CacheDirError
from cek.kernel import Kernel

HERE = Path(__file__).resolve().parent
PRELUDE = HERE / "prelude.h"
RUNTIME = HERE / "runtime.cpp"
TRAFFIC = HERE / "traffic.cpp"
CXX = "g++"

# -O2 builds a kernel in about the time -O1 does and runs its launches faster.
# -fno-strict-aliasing: CUDA code reads float arrays through float4 pointers.
# -fno-extern-tls-init: shared memory is thread_local (see prelude.h) and never has a dynamic
# initializer; without it an `extern __shared__` array calls a null TLS init hook.
# -fno-omit-frame-pointer: the runtime walks the frames that reached a barrier or a shuffle
# (runtime.cpp, call_path); -fno-optimize-sibling-calls: a barrier a kernel ends with stays a call,
# whose return address says where it was called; -g1: the line tables that name the callers.
COMMON = (
    "-std=c++20", "-O2", "-fPIC", "-fvisibility=hidden", "-fno-math-errno",
    "-fno-strict-aliasing", "-fno-threadsafe-statics", "-fno-extern-tls-init",
    "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-g1",
    "-fdiagnostics-color=never",
)
FLAVOURS = {
    # flavour: (flags of the kernel's own code, define for the runtime)
    "plain": (("-fsanitize=alignment",), ()),
    "thread": (("-fsanitize=alignment", "-fsanitize=thread"), ("-DCEK_TSAN",)),
    "address": (
        ("-fsanitize=alignment", "-fsanitize=address"),
        ("-DCEK_ASAN",),
    ),
    # Outlined KASAN checks are calls to hooks that traffic.cpp defines to count every access
    # (see there); nothing else of KASAN is wanted: no redzones, no use-after-scope poisoning.
    # --wrap: memcpy and friends, which KASAN leaves unchecked, must not touch an array unseen.
    "traffic": (
        ("-fsanitize=alignment", "-fsanitize=kernel-address",
         "--param=asan-instrumentation-with-call-threshold=0", "--param=asan-stack=0",
         "--param=asan-globals=0", "-fno-sanitize-address-use-after-scope",
         "-Wl,--wrap=memcpy,--wrap=memmove,--wrap=memset"),
        (),
    ),
}
# The runtime's sources per flavour, the last one compiled (it includes the others).
RUNTIME_SOURCES = {"traffic": (RUNTIME, TRAFFIC)}
DYNAMIC_SHARED_BYTES = 48 * 1024  # kDynamicSharedCapacity in runtime.cpp
STALE_BUILD_S = 3600  # a .build-* folder this old belongs to a build that was killed
# What runner.py calls in a kernel library of each flavour.
SYMBOLS = {"plain": ("cek_launch", "cek_stop"), "traffic": ("cek_launch", "cek_stop",
                                                            "cek_traffic_watch")}

# `extern __shared__ T name[];`: the kernel declares it, the generated unit defines it.
_DYNAMIC_SHARED = re.compile(r"\bextern\s+__shared__\s+[^;]*?\b([A-Za-z_]\w*)\s*\[\s*\]\s*;")

compiles = 0  # g++ runs in this process, for tests of the cache
_memo: dict[tuple[str, str], Path] = {}
_memo_lock = threading.Lock()
_key_locks: dict[tuple[str, str], threading.Lock] = {}


def cache_dir() -> Path:
    """`$CEK_CACHE_DIR`, else `$XDG_CACHE_HOME/cek`, else `~/.cache/cek`, as an absolute path
    (g++ runs in a temporary folder, where a relative one would point elsewhere); a leading `~`
    that the shell left quoted is expanded."""
    if os.environ.get("CEK_CACHE_DIR"):
        path = Path(os.environ["CEK_CACHE_DIR"]).expanduser()
    elif os.environ.get("XDG_CACHE_HOME"):
        path = Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "cek"
    else:
        try:
            path = Path.home() / ".cache" / "cek"
        except RuntimeError as exc:  # no HOME and no password entry
            raise CacheDirError("~/.cache/cek", str(exc)) from None
    return path.absolute()


def _made_folder(path: Path) -> Path:
    """`path`, its missing levels created private; CacheDirError if it cannot be."""
    try:
        cache.make_private(path)
    except OSError as exc:
        raise CacheDirError(path, exc.strerror or type(exc).__name__) from None
    return path


def _writable_folder(path: Path) -> Path:
    """`path`; CacheDirError if it is not a folder this process can write."""
    if not os.access(path, os.W_OK | os.X_OK):
        raise CacheDirError(path, "not writable")
    return path


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    if shutil.which(CXX) is None:
        raise RuntimeError(f"the emulator needs {CXX} (C++20) on PATH")
    out = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0]


def entry_source(kernel: Kernel) -> str:
    """The generated unit: `cek_kernel_entry(void** args)` and the dynamic shared memory."""
    # Pointers travel as void*: an extern "C" symbol has no parameter types to match, a pointer
    # passes alike whatever it points to, and cek_f16 and friends are not declared here.
    ctypes = ["void*" if a.is_pointer else kernel.c_type(a) for a in kernel.args]
    params = ", ".join(ctypes)
    values = ", ".join(f"*static_cast<{c}*>(args[{i}])" for i, c in enumerate(ctypes))
    names = sorted(set(_DYNAMIC_SHARED.findall(kernel.source)))
    # As on a GPU through CuPy (-ftz=true): float arithmetic flushes subnormals, double does not.
    flush = 0 if kernel.dtype == "f64" else 1
    lines = [
        f'extern "C" int cek_flush_subnormals() {{ return {flush}; }}',
        f'extern "C" void {kernel.entry_point_name()}({params});',
        'extern "C" void cek_kernel_entry(void** args) {',
        f"    {kernel.entry_point_name()}({values});",
        "}",
    ]
    if names:
        # Every extern __shared__ array of a CUDA kernel starts at the same address: aliases.
        lines += [
            f'extern "C" {{ alignas(16) thread_local unsigned char '
            f"cek_dynamic_shared_bytes[{DYNAMIC_SHARED_BYTES}]; }}",
            *(f"extern thread_local unsigned char {name}[{DYNAMIC_SHARED_BYTES}] "
              f'__attribute__((alias("cek_dynamic_shared_bytes")));' for name in names),
            'extern "C" unsigned char* cek_dynamic_shared() { return cek_dynamic_shared_bytes; }',
        ]
    else:
        lines.append('extern "C" unsigned char* cek_dynamic_shared() { return nullptr; }')
    return "\n".join(lines) + "\n"


def compiled_source(kernel: Kernel) -> str:
    """The kernel's `source`, with a line directive before the generated entry point: its lines
    are no lines of the last `.cu` file, and a KernelError's callers stop at the kernel's own."""
    return (kernel.kernel_source + "\n\n" + f'#line 1 "{kernel.entry_point_name()} (generated)"\n'
            + kernel.entry_point_source)


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


def _run(command: list[str], what: str, cwd: Path) -> None:
    global compiles
    with _memo_lock:
        compiles += 1
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise CompileError(what, (done.stdout + done.stderr).strip())


def _checksum_path(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _verified(target: Path) -> bool:
    """True if target and its checksum exist and agree."""
    try:
        return _checksum_path(target).read_text().strip() == _file_digest(target)
    except (OSError, UnicodeDecodeError):
        return False


def _build_prefix() -> str:
    """`.build-<host>-<pid>-`: who owns a scratch folder, so that a killed build's is known."""
    return f".build-{socket.gethostname()}-{os.getpid()}-"


def _owner_is_gone(name: str) -> bool:
    """True if `name` is a scratch folder of this host whose process no longer exists."""
    host, sep, rest = name[len(".build-"):].rpartition("-")[0].rpartition("-")
    if not sep or host != socket.gethostname() or not rest.isdigit():
        return False
    try:
        os.kill(int(rest), 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, under another user
        return False
    return False


def _remove_stale_builds(folder: Path) -> None:
    now = time.time()
    for stale in folder.glob(".build-*"):
        try:
            if _owner_is_gone(stale.name) or now - stale.stat().st_mtime > STALE_BUILD_S:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:  # another process removed it first
            pass


def _build_once(target: Path, build) -> Path:
    """Run build(tmp_dir) -> file unless target exists with its checksum, then move the file and
    then its checksum into place. `target` lies under cache_dir(); the file returned is there,
    or in the process's private folder where cek.cache does not trust the cached one."""
    target = cache.usable(cache_dir(), _made_folder(target.parent) / target.name)
    if _verified(target):
        return target
    folder = _writable_folder(target.parent)
    _remove_stale_builds(folder)
    try:
        scratch = tempfile.TemporaryDirectory(dir=folder, prefix=_build_prefix())
    except OSError as exc:
        raise CacheDirError(folder, exc.strerror or str(exc)) from None
    with scratch as tmp:
        built = build(Path(tmp))
        try:
            checksum = Path(tmp) / "checksum"
            checksum.write_text(_file_digest(built) + "\n")
            for written in (built, checksum):  # whatever the umask: trusted next time
                os.chmod(written, stat.S_IMODE(written.stat().st_mode) & ~0o022)
            os.replace(built, target)
            os.replace(checksum, _checksum_path(target))
        except OSError as exc:  # a full disk, a folder made read-only meanwhile
            raise CacheDirError(folder, exc.strerror or str(exc)) from None
    return target


def _runtime_sources(flavour: str) -> tuple[Path, ...]:
    return RUNTIME_SOURCES.get(flavour, (RUNTIME,))


def runtime_object(flavour: str) -> Path:
    """The runtime compiled for `flavour`: one object shared by every kernel library."""
    flags = (*COMMON, *FLAVOURS[flavour][1])
    sources = _runtime_sources(flavour)
    key = _digest(PRELUDE.read_bytes(), *(s.read_bytes() for s in sources), *flags,
                  compiler_version())
    target = cache_dir() / "emulate" / f"runtime-{flavour}-{key[:16]}.o"

    def build(tmp: Path) -> Path:
        out = tmp / "runtime.o"
        _run([CXX, *flags, "-I", str(HERE), "-c", str(sources[-1]), "-o", str(out)],
             f"emulator runtime ({flavour})", tmp)
        return out

    return _build_once(target, build)


def library(kernel: Kernel, flavour: str = "plain") -> Path:
    """The path of the kernel's library for `flavour`, building it if no cache holds it."""
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {sorted(FLAVOURS)}, got {flavour!r}")
    flags = (*COMMON, *FLAVOURS[flavour][0])
    entry = entry_source(kernel)
    key = _digest(compiled_source(kernel), entry, PRELUDE.read_bytes(),
                  *(s.read_bytes() for s in _runtime_sources(flavour)), *flags,
                  *FLAVOURS[flavour][1], compiler_version())
    memo_key = (str(cache_dir()), key)
    with _memo_lock:
        if memo_key in _memo:
            return _memo[memo_key]
        key_lock = _key_locks.setdefault(memo_key, threading.Lock())
    with key_lock:  # threads loading the same kernel build it once
        target = cache_dir() / "emulate" / f"{kernel.id}-{flavour}-{key[:16]}.so"

        def build(tmp: Path) -> Path:
            runtime = runtime_object(flavour)
            (tmp / "kernel.cpp").write_text(compiled_source(kernel))
            (tmp / "entry.cpp").write_text(entry)
            out = tmp / "kernel.so"
            _run([CXX, *flags, "-include", str(PRELUDE), "-shared", "kernel.cpp", "entry.cpp",
                  str(runtime), "-o", str(out)], kernel.id, tmp)
            return out

        path = _build_once(target, build)
        missing = cache.missing_symbols(path, SYMBOLS.get(flavour, SYMBOLS["plain"]))
        if missing:
            raise CacheDirError(path, f"a library without {', '.join(missing)}: remove it and "
                                "cek builds it again")
        with _memo_lock:
            _memo[memo_key] = path
        return path


def forget() -> None:
    """Drop the in-process memo (the disk cache stays), so the next load looks at the disk."""
    with _memo_lock:
        _memo.clear()
