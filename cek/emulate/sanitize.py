"""Run one launch under ThreadSanitizer or AddressSanitizer, in a subprocess.

A sanitizer runtime must be loaded before anything else in a process, so each sanitized launch
runs in a fresh Python with the runtime in LD_PRELOAD. It is preloaded into the real interpreter
binary: `sys.executable` may be a shim script, and a shell under LD_PRELOAD crashes. The child
runs `_child.py` as a script without site packages (it needs only ctypes and `runner.py`), so it
starts in a fraction of a second even under ThreadSanitizer. It copies every array into a buffer
of exactly its size from the sanitizer's allocator, so AddressSanitizer sees where each one ends,
and sends the arrays back afterwards.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from cek.emulate.build import CXX
from cek.emulate.errors import KernelError

RUNTIMES = {"thread": "libtsan.so", "address": "libasan.so"}
# atexit_sleep_ms=0: ThreadSanitizer otherwise waits a second at exit for threads to finish.
OPTIONS = {
    "thread": ("TSAN_OPTIONS",
               "halt_on_error=1:exitcode=66:report_signal_unsafe=0:atexit_sleep_ms=0"),
    "address": ("ASAN_OPTIONS", "halt_on_error=1:detect_leaks=0:detect_odr_violation=0"),
}
_REPORT = re.compile(r"(?:WARNING|ERROR): (?:ThreadSanitizer|AddressSanitizer): .*")
# A frame's source location: the whole path (absolute, or `kernels/...` as cek.sources writes it).
_KERNEL_FRAME = re.compile(r"(?<!\S)(\S+\.(?:cu|cuh)):(\d+)")
TIMEOUT_S = 600


@functools.lru_cache(maxsize=None)
def _preload(flavour: str) -> str:
    out = subprocess.run([CXX, f"-print-file-name={RUNTIMES[flavour]}"], capture_output=True,
                         text=True, check=True).stdout.strip()
    if not os.path.isabs(out) or not os.path.exists(out):
        raise RuntimeError(f"{CXX} has no {RUNTIMES[flavour]}: cannot run sanitize={flavour!r}")
    return out


def _environment(flavour: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_PRELOAD"] = _preload(flavour)
    name, options = OPTIONS[flavour]
    env[name] = options + (":" + env[name] if env.get(name) else "")
    return env


def _report_error(flavour: str, stderr: str) -> KernelError | None:
    """The first sanitizer report in stderr, located at its first kernel source frame."""
    match = _REPORT.search(stderr)
    if not match:
        return None
    report = stderr[match.start():]
    frame = _KERNEL_FRAME.search(report)
    where = f"{frame[1]}:{frame[2]}: " if frame else ""
    headline = match[0].split(": ", 1)[1]
    return KernelError(f"{where}{headline} (sanitize={flavour!r})\n{report.strip()}")


def launch(library: str, flavour: str, ctypes_of_args, values, grid, block, shared_mem,
           schedule) -> None:
    """Run the launch in a sanitized child; copy the arrays it returns into `values`."""
    args = []
    for ctype, value in zip(ctypes_of_args, values):
        if isinstance(value, np.ndarray):
            # The address modulo 256 travels too, so an unaligned view stays unaligned.
            args.append(("array", value.tobytes(), value.ctypes.data % 256))
        else:
            args.append((ctype, value.item() if isinstance(value, np.generic) else value))
    payload = pickle.dumps({
        "library": library, "ctypes": list(ctypes_of_args), "args": args, "grid": grid,
        "block": block, "shared_mem": shared_mem, "schedule": schedule,
    })
    command = [os.path.realpath(sys.executable), "-S", str(Path(__file__).with_name("_child.py"))]
    try:
        done = subprocess.run(command, input=payload, capture_output=True,
                              env=_environment(flavour), timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise KernelError(f"sanitize={flavour!r}: the launch ran past {TIMEOUT_S} s") from exc
    stderr = done.stderr.decode(errors="replace")
    error = _report_error(flavour, stderr)
    if error is not None:
        raise error
    try:
        result = pickle.loads(done.stdout)
    except Exception:
        raise KernelError(
            f"sanitize={flavour!r}: the launch crashed (exit status {done.returncode})\n"
            f"{stderr[-4000:]}"
        ) from None
    if result["error"]:
        raise KernelError(result["error"])
    arrays = [v for v in values if isinstance(v, np.ndarray)]
    for array, data in zip(arrays, result["arrays"]):
        array[...] = np.frombuffer(data, dtype=array.dtype).reshape(array.shape)
