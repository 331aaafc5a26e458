"""Load and launch Kernels on a CUDA GPU with CuPy.

`cupy.RawModule(code=kernel.source, options=LOADER_OPTIONS)` compiles with NVRTC for the current
device, with the options cek.compile.nvrtc_options names (so `cek compile` reads the same cubin).
CuPy keeps the disk cache (CUPY_CACHE_DIR, keyed on source and options; CuPy >= 13, older
releases hashed a PTX that CUDA 12 salts, so the cache never hit). This module memoizes the
loaded function in process per (cache_key, options, device), so a launch costs a dict lookup.

CuPy is imported on first use: `import cek` works without it, and without a GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import threading
from typing import Any, Callable, Sequence

import numpy as np

from cek.compile import LOADER_OPTIONS, CompileError, nvrtc_wheel
from cek.kernel import Kernel
from cek.occupancy import SmLimits, occupancy_on
from cek.tiling import WARP

NO_DEVICE_HINT = "`cek check --device cpu` and `cek compile` work without one"
# cek is installed from a checkout, so the extras are named on the checkout ('.[cuda12]'), and
# the CuPy wheels by their own names.
CUPY_INSTALL_HINT = ("pip install cupy-cuda12x (CUDA 12.x driver) or cupy-cuda13x (13.x), "
                     "or from a cek checkout pip install '.[cuda12]' or '.[cuda13]'")


class NoDeviceError(RuntimeError):
    """CuPy is missing or sees no CUDA device."""


_noticed = False  # no_device_notice has been given in this process
_notice_lock = threading.Lock()


_lock = threading.Lock()
_functions: dict[tuple, Any] = {}


def cupy_or_none():
    """The cupy module, or None when it is not installed (or cannot load its CUDA libraries)."""
    try:
        import cupy
    except Exception:  # ImportError, or a CUDA library that fails to load
        return None
    return cupy


def device_count() -> int:
    cupy = cupy_or_none()
    if cupy is None:
        return 0
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver, or a driver too old for this CuPy: no usable device
        return 0


def _cuda_version(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"  # 13020: 13.2


def no_device_reason() -> str | None:
    """Why no CUDA device is usable, in words to act on, or None when one is. Without a driver
    CuPy's own error is cudaErrorInsufficientDriver, "CUDA driver version is insufficient for
    CUDA runtime version", which reads as "upgrade the driver": the versions tell the cases
    apart (the driver's is 0 where none is loaded)."""
    cupy = cupy_or_none()
    if cupy is None:
        if importlib.util.find_spec("cupy") is None:
            return "CuPy is not installed"
        return "CuPy is installed but cannot load its CUDA libraries"
    try:
        runtime = cupy.cuda.runtime
        try:
            if runtime.getDeviceCount() > 0:
                return None
            status = None
        except Exception as exc:  # CuPy's CUDARuntimeError, with the CUDA status
            status = getattr(exc, "status", None)
        driver, needed = runtime.driverGetVersion(), runtime.runtimeGetVersion()
    except Exception:  # a CuPy that answers none of this
        return "CuPy cannot reach a GPU"
    if driver == 0:
        return "no NVIDIA driver is installed"
    if driver < needed:
        return (f"the NVIDIA driver supports CUDA {_cuda_version(driver)}, older than the CUDA "
                f"{_cuda_version(needed)} that CuPy was built for")
    if status in (None, 100):  # no error but no device, or cudaErrorNoDevice
        return "the NVIDIA driver sees no GPU"
    return f"CuPy cannot reach a GPU (CUDA error {status})"


def no_device_notice(instead: str) -> str | None:
    """The line that says no CUDA device is usable, why, and that `instead` runs in its place
    ("checking on the CPU emulator"): the first time a caller asks in this process, None after
    that, and None while a device is usable."""
    global _noticed
    with _notice_lock:
        if _noticed:
            return None
        reason = no_device_reason()
        if reason is None:
            return None
        _noticed = True
    return f"no usable CUDA device ({reason}): {instead}"


def require_cupy():
    """cupy, when a CUDA device is usable; NoDeviceError otherwise, saying why in one line."""
    cupy = cupy_or_none()
    if cupy is None:
        raise NoDeviceError(
            f"running on a GPU needs CuPy: {CUPY_INSTALL_HINT}; {NO_DEVICE_HINT}"
        )
    if device_count() == 0:
        reason = no_device_reason()
        raise NoDeviceError(f"no CUDA device found; {NO_DEVICE_HINT}, and NumPy arrays run on "
                            f"the CPU{f' ({reason})' if reason else ''}")
    return cupy


def get_function(kernel: Kernel, options: Sequence[str] = LOADER_OPTIONS):
    """The compiled `cupy.RawKernel` of `kernel` on the current device, memoized."""
    cupy = require_cupy()
    key = (kernel.cache_key(), tuple(options), cupy.cuda.Device().id)
    function = _functions.get(key)  # a dict lookup is atomic: the lock only guards the build
    if function is not None:
        return function
    with _lock:
        function = _functions.get(key)
        if function is None:
            try:
                module = cupy.RawModule(code=kernel.source, options=tuple(options))
                function = module.get_function(kernel.entry_point_name())
            except cupy.cuda.compiler.CompileException as exc:
                raise CompileError(kernel.id, str(exc), *_cupy_nvrtc(cupy)) from exc
            _functions[key] = function
    return function


def is_loaded(kernel: Kernel, device_id: int, options: Sequence[str] = LOADER_OPTIONS) -> bool:
    """Whether get_function has compiled and loaded `kernel` on device `device_id` already."""
    return (kernel.cache_key(), tuple(options), device_id) in _functions


def _cupy_nvrtc(cupy) -> tuple:
    """(version, upgrade command) of the NVRTC CuPy compiles with, for CompileError."""
    major, minor = cupy.cuda.nvrtc.getVersion()
    return (major, minor), f"pip install -U {nvrtc_wheel(major)} (the NVRTC CuPy loads)"


def raw_args(kernel: Kernel, cast: Sequence[Any]) -> tuple:
    """Checked args as a CuPy RawKernel must be given them. An absent optional pointer becomes
    np.uint64(0), eight zero bytes by value: a null pointer under every CuPy. CuPy 13 turned None
    into a NULL *argument address* (cupy#9046), where the kernel read garbage for `dy ==
    nullptr`; cek needs CuPy 14, whose None is said to be a null value, but no GPU run has shown
    it yet, and the explicit zero costs nothing."""
    return tuple(np.uint64(0) if spec.is_pointer and value is None else value
                 for spec, value in zip(kernel.args, cast))


def load(kernel: Kernel, options: Sequence[str] = LOADER_OPTIONS) -> Callable:
    """A callable `f(grid, block, args, *, shared_mem=0, stream=None)`, as a CuPy RawKernel.

    Unlike a bare RawKernel it checks `args` against `kernel.args` (CuPy arrays of the right
    dtype, shape and contiguity, all on the current device) and casts scalars to their C types.
    """
    cupy = require_cupy()

    def launch(grid, block, args, *, shared_mem: int = 0, stream=None):
        cast = kernel.check_args(args, (cupy.ndarray,))
        kernel.check_launch_of(grid, block, cast)
        _launch_checked(cupy, kernel, options, grid, block, cast, shared_mem, stream)

    return launch


def _launch_checked(cupy, kernel, options, grid, block, cast, shared_mem, stream) -> None:
    """Launch with args that passed kernel.check_args: the device check, then the function of
    the current device, looked up per launch (a dictionary hit): the device may have changed."""
    device = cupy.cuda.Device().id
    for spec, value in zip(kernel.args, cast):
        if spec.is_pointer and value is not None and value.device.id != device:
            raise TypeError(
                f"{spec.name} is on GPU {value.device.id}, not the current GPU {device}")
    function = get_function(kernel, options)
    function(tuple(grid), tuple(block), raw_args(kernel, cast), shared_mem=shared_mem,
             stream=stream)


def launch(kernel: Kernel, *args, stream=None) -> tuple:
    """Check `args`, take the kernel's own launch configuration, and launch on `stream`
    (default: CuPy's current stream; any object with CuPy's `ptr` of a stream will do). A
    kernel with a wave grid (tiling.WaveGrid: the keep kernels) gets the grid of one wave of
    the current device. Returns the (grid, block, shared_mem) it launched with."""
    cupy = require_cupy()
    cast = kernel.check_args(args, (cupy.ndarray,))
    grid, block, shared_mem = launch_config(kernel, *kernel.problem_size(cast))
    _launch_checked(cupy, kernel, LOADER_OPTIONS, grid, block, cast, shared_mem, stream)
    return grid, block, shared_mem


def launch_config(kernel: Kernel, *problem) -> tuple:
    """kernel.launch_config for `problem` on the current device: a wave grid (the keep kernels)
    is one wave of its multiprocessors, each holding the blocks that fit on it
    (resident_blocks)."""
    config = _launch_config(kernel, *problem)
    if not getattr(kernel, "wave_grid", False):
        return config
    device = require_cupy().cuda.Device().id
    _, block, shared_mem = config
    per_sm = resident_blocks(kernel, device, math.prod(block), shared_mem)
    return _launch_config(kernel, *problem, sms=multiprocessors(device), blocks_per_sm=per_sm)


@functools.lru_cache(maxsize=1024)
def _launch_config(kernel: Kernel, *problem, sms: int | None = None,
                   blocks_per_sm: int | None = None) -> tuple:
    """kernel.launch_config, memoized per problem (kernel.problem_size: n_rows and n_dim; for
    the reduction, whether partials are given too) and, for a wave grid, the device's
    multiprocessors and the blocks each holds: a training loop launches the same few problems
    step after step, and a launch's host time counts on small batches."""
    if sms is None:
        return kernel.launch_config(*problem)
    return kernel.launch_config(*problem, sms=sms, blocks_per_sm=blocks_per_sm)


@functools.lru_cache(maxsize=64)
def multiprocessors(device_id: int) -> int:
    """The multiprocessors (SMs) of CUDA device `device_id`: what a wave of blocks is made of."""
    cupy = require_cupy()
    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


@functools.lru_cache(maxsize=64)
def sm_limits(device_id: int) -> SmLimits:
    """What one SM of CUDA device `device_id` holds, as the device reports it: an sm_75 SM holds
    1024 threads and 16 blocks, an sm_80 or sm_90 one 2048 and 32. Shared memory is allocated
    in units of 256 bytes on 7.x, 128 from 8.0 on (cuda_occupancy.h). A device that reports
    none of these (a stand-in) is taken for sm_80's."""
    props = require_cupy().cuda.runtime.getDeviceProperties(device_id)
    default = SmLimits()
    threads = int(props.get("maxThreadsPerMultiProcessor", default.max_threads))
    return SmLimits(
        max_blocks=int(props.get("maxBlocksPerMultiProcessor", default.max_blocks)),
        max_warps=threads // WARP, max_threads=threads,
        registers=int(props.get("regsPerMultiprocessor", default.registers)),
        shared_bytes=int(props.get("sharedMemPerMultiprocessor", 164 * 1024)),
        shared_unit=256 if props.get("major", 8) == 7 else 128,
        shared_reserved=int(props.get("reservedSharedMemPerBlock", default.shared_reserved)))


@functools.lru_cache(maxsize=1024)
def resident_blocks(kernel: Kernel, device_id: int, threads: int, shared_mem: int) -> int:
    """Blocks of `kernel` (of `threads` threads, `shared_mem` dynamic shared bytes) that one SM
    of device `device_id` holds at once: its occupancy on that SM (sm_limits) with the registers
    and static shared memory of the compiled function. Where the function does not say (a
    stand-in), its __launch_bounds__ promise, min_blocks, bounds the registers' share. At least
    1, so that a launch that cannot fit fails in CUDA, saying so."""
    function = get_function(kernel)
    registers = getattr(function, "num_regs", None)
    shared = getattr(function, "shared_size_bytes", 0) + shared_mem
    fit = occupancy_on(sm_limits(device_id), threads, registers or 0, shared).blocks_per_sm
    if registers is None:
        fit = min(fit, kernel.min_blocks)
    return max(1, fit)


class CaptureError(RuntimeError):
    """A kernel's first launch was asked for inside a CUDA-graph capture."""


def refuse_capture(kernel: Kernel) -> None:
    """CaptureError: the first launch of `kernel` (for a signature) compiles it with NVRTC and
    loads the module, which a CUDA-graph capture does not allow (the capture would fail with
    CUDA's error, and the graph with it). Said before anything is asked of the device."""
    raise CaptureError(
        f"{kernel.id} has not run yet in this process, and its first launch compiles and loads "
        f"it, which CUDA-graph capture forbids: run the step once before capturing it (a "
        f"warm-up with the same shapes and dtypes), as torch.cuda.graph's own docs advise")
