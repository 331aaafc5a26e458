"""A stand-in for CuPy on a machine without a GPU: NumPy arrays posing as device arrays, and the
CPU emulator (the real kernel source) in place of the compiled kernels.

Only what cek's GPU glue and `cek bench` use is there, so anything else they start to use fails
loudly. `install(monkeypatch)` puts it in place of the `cupy` module. Launches still go through
cek.gpu.launch and cek.gpu.load with their checks; only cek.gpu.get_function, which compiles
with NVRTC, is replaced. Its functions take what a RawKernel takes, device pointers given as
addresses (ints) included: the emulator then reads and writes the memory there.

Two of CuPy's ways are kept because cek's glue must respect them. Its runtime calls are
compiled code that torch.compile cannot trace: here too (a builtin), so such a call on a traced
path fails under fullgraph=True as it does on a GPU. Its from_dlpack asks a tensor for its
capsule on CuPy's current stream (the legacy default stream when none is entered), which makes
torch order the export against its own current stream: the stream each import asked for is
recorded (`dlpack_streams`), so a test can see that none asks for another stream than torch's.

It cannot stand in for what only CuPy and a driver do: the real DLPack exchange and its stream
synchronization, stream ordering, device memory, CuPy's own reductions and casts, and time: its
events report FAKE_MS, not a measurement.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import sys
import types
from dataclasses import dataclass

import numpy as np

from cek import emulate, gpu, validate

# What the fake CUDA events report as elapsed milliseconds, in turn. A timing of a multiple of
# len(FAKE_MS) repetitions sees each value equally often, so its percentiles are known.
FAKE_MS = (0.1, 0.2, 0.3, 0.4, 0.5)
NAME = "Stand-in GPU (NumPy and the cek emulator)"
CUDA_VERSION = 12080
NVRTC_VERSION = (12, 8)
# The stand-in GPU's multiprocessors: few, so that a keep kernel's wave grid (a few blocks a
# multiprocessor) is smaller than a block a row at the tests' shapes, and its loops run.
SMS = 2


_GPU0 = types.SimpleNamespace(id=0)


class DeviceArray(np.ndarray):
    """A NumPy array posing as a cupy.ndarray on GPU 0: `.device.id`, `.data.ptr`, and 0-d
    arrays where NumPy gives scalars (y[i]), as CuPy does. Its mean and sum, each a kernel
    launch of its own in CuPy, are recorded (method, size) in `reductions` (StandIn's)."""

    reductions: list = []

    def mean(self, *args, **kwargs):
        DeviceArray.reductions.append(("mean", self.size))
        return super().mean(*args, **kwargs)

    def sum(self, *args, **kwargs):
        DeviceArray.reductions.append(("sum", self.size))
        return super().sum(*args, **kwargs)

    def __getitem__(self, index):
        item = super().__getitem__(index)
        return np.asarray(item).view(DeviceArray) if isinstance(item, np.generic) else item

    @property
    def device(self):
        return _GPU0

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


def _on_device(function):
    """`function` of NumPy, its array result as a DeviceArray (sharing memory, like CuPy's)."""
    return lambda *args, **kwargs: np.asarray(function(*args, **kwargs)).view(DeviceArray)


def _asarray(a, dtype=None):
    """cupy.asarray: a device array of that dtype is itself; anything else is copied in."""
    if isinstance(a, DeviceArray) and (dtype is None or a.dtype == dtype):
        return a
    return np.array(a, dtype=dtype).view(DeviceArray)


class _Generator:
    """cupy.random.Generator: NumPy's, its results on the device."""

    def __init__(self, seed):
        self._rng = np.random.default_rng(seed)

    def standard_normal(self, size, dtype=np.float64):
        return self._rng.standard_normal(size, dtype=dtype).view(DeviceArray)

    def random(self, size):
        return self._rng.random(size).view(DeviceArray)


LEGACY_DEFAULT_STREAM = 1  # what CuPy passes to __dlpack__ when no stream is entered


@dataclass
class Launch:
    kernel_id: str
    args: dict  # by the kernel's argument names
    device: int | None  # the current cupy.cuda.Device at the launch
    stream: int | None  # the pointer of the stream it was given, or None (CuPy's current)


class StandIn:
    """The fake cupy module, the launches made through it, and how many event times were read
    (each is one timed repetition) and streams synchronized."""

    def __init__(self):
        self.launches: list[Launch] = []
        self.device = 0
        self.elapsed_reads = self.synchronizations = 0
        self.dlpack_streams: list[int | None] = []
        self.reductions = DeviceArray.reductions = []  # CuPy mean/sum calls: (method, size)
        self._fake_ms = itertools.cycle(FAKE_MS)
        self.cupy = types.ModuleType("cupy")  # only what cek uses: anything else fails
        c = self.cupy
        c.__version__ = "0.0-standin"
        c.ndarray = DeviceArray
        for name in ("float16", "float32", "float64", "int16", "uint16", "uint32"):
            setattr(c, name, getattr(np, name))
        for name in ("ascontiguousarray", "empty", "empty_like", "full", "ones", "zeros", "where",
                     "sqrt"):
            setattr(c, name, _on_device(getattr(np, name)))
        c.asarray = _asarray
        c.asnumpy = lambda a: np.array(a)  # a host copy, a plain ndarray
        c.copyto = np.copyto
        c.nan = np.nan
        c.may_share_memory = np.may_share_memory
        c.from_dlpack = self._from_dlpack
        c.random = types.SimpleNamespace(default_rng=_Generator)
        c.cuda = types.SimpleNamespace(
            Device=self._device_class(),
            Event=lambda: types.SimpleNamespace(record=lambda stream=None: None),
            get_elapsed_time=self._elapsed_time,
            get_current_stream=lambda: types.SimpleNamespace(synchronize=self._synchronize),
            runtime=types.SimpleNamespace(
                getDeviceCount=itertools.repeat(1).__next__,  # compiled, as CuPy's: untraceable
                getDeviceProperties=lambda device_id: {"name": NAME.encode(),
                                                        "multiProcessorCount": SMS},
                runtimeGetVersion=lambda: CUDA_VERSION,
                driverGetVersion=lambda: CUDA_VERSION,
            ),
            nvrtc=types.SimpleNamespace(getVersion=lambda: NVRTC_VERSION),
        )

    def _device_class(self):
        standin = self

        class Device:
            """cupy.cuda.Device: `Device().id` is the current device; `with Device(i)`."""

            def __init__(self, device_id=None):
                self.id = standin.device if device_id is None else device_id

            def __enter__(self):
                self.outer, standin.device = standin.device, self.id

            def __exit__(self, *exc):
                standin.device = self.outer

        return Device

    def _from_dlpack(self, array):
        """cupy.from_dlpack, on CPU tensors (NumPy's import shares their memory, as CuPy's does
        a GPU tensor's). A capsule is imported as it is: no stream handshake, recorded as None.
        An object of the protocol is asked for its capsule on CuPy's current stream, as CuPy
        asks: here always the legacy default stream, as none can be entered (that stream is
        recorded; a CPU tensor refuses any, so it is then asked without one)."""
        if hasattr(array, "__dlpack_device__"):
            self.dlpack_streams.append(LEGACY_DEFAULT_STREAM)  # no stream is ever entered
            return np.from_dlpack(array).view(DeviceArray)
        self.dlpack_streams.append(None)
        import torch  # only torch makes the capsules here; NumPy would import them read-only

        return torch.from_dlpack(array).numpy().view(DeviceArray)

    def _elapsed_time(self, start, end) -> float:
        self.elapsed_reads += 1
        return next(self._fake_ms)

    def _synchronize(self) -> None:
        self.synchronizations += 1

    def get_function(self, kernel, options=()):
        """cek.gpu.get_function: the compiled RawKernel of `kernel`, here the emulator's, which
        checks the arguments again; each launch is recorded."""
        function = emulate.load(kernel)

        def launch(grid, block, args, *, shared_mem=0, stream=None):
            # As real CuPy: None would become a NULL argument address, not a null pointer
            # (cupy#9046), so a null pointer must come as np.uint64(0); the emulator takes None.
            if any(value is None for value in args):
                raise TypeError("a RawKernel argument is None: CuPy would pass a NULL address")
            args = _arrays_at_pointers(kernel, args)
            function(grid, block, args, shared_mem=shared_mem)
            named = {spec.name: value for spec, value in zip(kernel.args, args)}
            pointer = None if stream is None else stream.ptr  # what CuPy reads of it
            self.launches.append(Launch(kernel.id, named, self.device, pointer))

        return launch

    def ids(self):
        return [launch.kernel_id for launch in self.launches]

    def array(self, a):
        return np.array(a).view(DeviceArray)


def _arrays_at_pointers(kernel, args) -> tuple:
    """A RawKernel's arguments as the emulator takes them: a pointer given as an address (an
    int, as cek.torch passes a tensor's data_ptr once its launch signature has been checked)
    becomes the array at that address, of the argument's dtype and the shape its int arguments
    give, sharing the memory; the address 0 becomes None (nullptr)."""
    sizes = {spec.name: int(value) for spec, value in zip(kernel.args, args)
             if spec.ctype == "int"}
    cast = []
    for spec, value in zip(kernel.args, args):
        if spec.is_pointer and isinstance(value, (int, np.integer)):
            if value == 0:
                value = None
            else:
                # the reduction's partials: [ceil(n_rows / slice)], no int argument's size;
                # the split's partial sums: a derived shape (Kernel.arg_shape)
                if spec.name == "partials":
                    shape = (kernel.blocks(sizes["n_rows"]),)
                elif spec.stride is not None and sizes[spec.stride] == 0:
                    shape = ()  # one value read for every row (a 0-d dy)
                elif spec.derived:
                    shape = kernel.arg_shape(spec, sizes["n_rows"], sizes["n_dim"])
                else:
                    shape = tuple(sizes[name] for name in spec.shape)
                dtype = kernel.arg_dtype(spec)
                count = math.prod(shape)
                memory = (ctypes.c_char * (count * dtype.itemsize)).from_address(int(value))
                value = np.frombuffer(memory, dtype, count).reshape(shape).view(DeviceArray)
        cast.append(value)
    return tuple(cast)


def install(monkeypatch) -> StandIn:
    """The stand-in in place of cupy, until the test ends: gpu.require_cupy gives it,
    gpu.get_function runs the emulator, and validate sees a DeviceArray as a CuPy array."""
    s = StandIn()
    monkeypatch.setitem(sys.modules, "cupy", s.cupy)
    # A builtin, as CuPy's device query behind the real require_cupy is: torch.compile cannot
    # trace it, so cek must never call it on a traced path.
    monkeypatch.setattr(gpu, "require_cupy", itertools.repeat(s.cupy).__next__)
    monkeypatch.setattr(gpu, "get_function", s.get_function)
    kind = validate.array_kind  # a DeviceArray is also an np.ndarray: ask about it first
    monkeypatch.setattr(validate, "array_kind",
                        lambda value: "cupy" if isinstance(value, DeviceArray) else kind(value))
    return s
