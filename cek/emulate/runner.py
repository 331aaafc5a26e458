"""Launch a built emulator library through ctypes, in this process.

Imports nothing from cek: the sanitizer subprocess (`_child.py`) runs this file without importing
cek and NumPy, which take seconds to import under ThreadSanitizer.
"""

from __future__ import annotations

import ctypes
import operator
import re
import threading
from typing import Sequence

SCHEDULES = {"forward": 0, "reverse": 1, "random": 2}  # enum Schedule in runtime.cpp
_RANDOM = re.compile(r"random:(\d+)")
_CTYPES = {"int": ctypes.c_int, "float": ctypes.c_float, "double": ctypes.c_double}
MAX_THREADS = 1024
MAX_SHARED_MEM = 48 * 1024


def parse_schedule(schedule: str) -> tuple[int, int]:
    """'forward', 'reverse' or 'random:<seed>' -> (runtime schedule, seed)."""
    if schedule in ("forward", "reverse"):
        return SCHEDULES[schedule], 0
    match = _RANDOM.fullmatch(schedule) if isinstance(schedule, str) else None
    if not match:
        raise ValueError(f"schedule must be 'forward', 'reverse' or 'random:<seed>', got {schedule!r}")
    return SCHEDULES["random"], int(match[1]) % 2**64


def launch_dims(value, what: str) -> tuple[int, int, int]:
    """A grid or block as CuPy takes it (an int or a tuple of 1 to 3 ints) -> (x, y, z)."""
    try:
        dims = tuple(operator.index(d) for d in (value if isinstance(value, tuple) else (value,)))
    except TypeError:
        dims = ()
    if not 1 <= len(dims) <= 3 or min(dims) < 1 or isinstance(value, bool):
        raise ValueError(f"{what} must be a positive int or a tuple of 1 to 3, got {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    if what == "block" and dims[0] * dims[1] * dims[2] > MAX_THREADS:
        raise ValueError(f"block {dims} has more than {MAX_THREADS} threads")
    if any(d >= 2**31 for d in dims):
        raise ValueError(f"{what} {dims} has a dimension of 2^31 or more")
    return dims


def check_shared_mem(shared_mem) -> int:
    if not isinstance(shared_mem, int) or not 0 <= shared_mem <= MAX_SHARED_MEM:
        raise ValueError(f"shared_mem must be an int in [0, {MAX_SHARED_MEM}], got {shared_mem!r}")
    return shared_mem


def check_first_block(first_block, name: str = "first_block") -> int:
    """The first block to run (or, name "blocks", how many); the runtime checks them against
    the grid's number of blocks."""
    try:
        value = operator.index(first_block)
    except TypeError:
        value = -1
    # Past 2^64 ctypes would wrap the value silently into the runtime's unsigned long.
    if isinstance(first_block, bool) or not 0 <= value < 2**64:
        raise ValueError(f"{name} must be an int in [0, 2^64), got {first_block!r}")
    return value


def arg_values(ctypes_of_args: Sequence[str], values: Sequence) -> list:
    """The launch's arguments as ctypes objects; a pointer is given as an address (int)."""
    return [
        ctypes.c_void_p(v) if ctype.endswith("*") else _CTYPES[ctype](v)
        for ctype, v in zip(ctypes_of_args, values)
    ]


class Watched(ctypes.Structure):
    """An array whose accesses a traffic library counts (struct CekWatched in traffic.cpp):
    `reads` and `writes` point at one uint32 counter per byte, both null for a None argument."""

    _fields_ = [("name", ctypes.c_char_p), ("base", ctypes.c_ulong), ("size", ctypes.c_ulong),
                ("reads", ctypes.c_void_p), ("writes", ctypes.c_void_p)]


class Library:
    """One loaded kernel library. Launches take a lock: the runtime's state is global."""

    def __init__(self, path: str):
        self.path = path
        self._dll = ctypes.CDLL(path)
        self._launch = self._dll.cek_launch
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [
            ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint),
            ctypes.POINTER(ctypes.c_uint), ctypes.c_ulong, ctypes.c_int, ctypes.c_ulonglong,
            ctypes.c_ulong, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_ulong,
        ]
        self._dll.cek_stop.argtypes = [ctypes.c_int]
        self._lock = threading.Lock()

    def launch(self, grid, block, values: list, shared_mem: int, schedule: tuple[int, int],
               first_block: int, watch: Sequence[Watched] = (), interruptible: bool = False,
               block_count: int = 0) -> str:
        """Run blocks first_block.. of the grid (block_count of them, 0: to its end); `values`
        from `arg_values`. Returns the
        runtime's error, "" if none. A traffic library counts the accesses to `watch`.
        interruptible: Ctrl-C stops the launch before its next block (KeyboardInterrupt)."""
        pointers = (ctypes.c_void_p * len(values))(
            *(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values)
        )
        error = ctypes.create_string_buffer(4096)
        with self._lock:
            if watch and self._dll.cek_traffic_watch(len(watch), (Watched * len(watch))(*watch)):
                raise ValueError(f"a traffic library watches at most 16 arrays, not {len(watch)}")
            call = (pointers, (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block),
                    shared_mem, schedule[0], schedule[1], first_block, block_count, error,
                    len(error))
            self._dll.cek_stop(0)  # a stop request ends with the launch it was made for
            try:
                if interruptible and threading.current_thread() is threading.main_thread():
                    failed = self._launch_interruptibly(call)
                else:
                    failed = self._launch(*call)
            finally:
                if watch:
                    self._dll.cek_traffic_watch(0, None)
        return error.value.decode(errors="replace") if failed else ""

    def _launch_interruptibly(self, call: tuple) -> int:
        """Run the launch on a worker thread while this (main) thread waits: Python handles
        SIGINT only in the main thread between bytecodes, never inside a foreign call, so a long
        launch run here directly would ignore Ctrl-C until it ended. The wait is on an Event,
        not Thread.join: a join that KeyboardInterrupt cuts short marks a running thread as
        finished (Python 3.11), and a next launch would then run beside it.
        SIGINT can also land inside Thread.start(), before or after the thread exists, which
        this thread cannot tell apart. So the launch and the interrupt each append to `first`,
        and only the first comes true: a launch that began is stopped and waited for, a thread
        that has not begun it never will."""
        result, done, first = [], threading.Event(), []

        def work():
            first.append("launch")
            if first[0] != "launch":
                return
            try:
                result.append(self._launch(*call))
            finally:
                done.set()

        try:
            threading.Thread(target=work, name="cek-emulate-launch", daemon=True).start()
            while not done.wait(0.1):
                pass
        except KeyboardInterrupt:
            while True:  # a second Ctrl-C must not leave the launch running either
                try:
                    self._dll.cek_stop(1)  # the runtime stops before its next block
                    first.append("interrupt")
                    # A block takes milliseconds; the lock is held until the launch ends.
                    while first[0] == "launch" and not done.wait(0.1):
                        pass
                    break
                except KeyboardInterrupt:
                    pass
            raise
        return result[0]


_libraries: dict[str, Library] = {}
_libraries_lock = threading.Lock()


def open_library(path: str) -> Library:
    """The library at `path`, loaded once per process."""
    with _libraries_lock:
        if path not in _libraries:
            _libraries[path] = Library(path)
        return _libraries[path]
