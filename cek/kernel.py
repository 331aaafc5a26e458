"""The Kernel class: one compiled instance of a `.cu` template, described by its documented fields.

A Kernel knows its source (the template from `kernels/` plus a generated `extern "C"` entry point
that fixes BLOCK_SIZE), its argument list, its launch configuration and how to check launch
arguments. It does not know how to run: `cek.gpu` and `cek.emulate` do that, and both go
through `check_args` and `launch_config` here, so the GPU and the CPU emulator accept exactly the
same launches.
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Any, ClassVar, Sequence

import numpy as np

from cek import dtypes
from cek.kernel_args import Arg, _arg_dtype, _arg_plan, _size_positions, address, c_scalar
from cek.sources import load_kernel_source
# the launch's shape, mirrored from kernels/cek_tiling.cuh (all of it importable from here too)
from cek.tiling import (GROUPED_16_BIT_SIZE, GROUPED_THREADS, MAX_BLOCKS_PER_SM,
                        MAX_GROUPED_CHUNKS, MAX_GROUPED_SIZE, MAX_THREADS, SM_LIMITS, SM_THREADS,
                        TAIL_THREADS, TWO_PAIRS_FROM_CHUNKS, WARP, RowGroups, WaveGrid, dims3,
                        is_int, next_power_of_two, register_path_width, sm_limits)


_REGISTRY: dict[str, type["Kernel"]] = {}

class Kernel:
    """Base class. Subclasses set `name`, `kind`, `args` and `bytes_moved`; `source_file` when the
    template lives in another kernel's file (a variant beside its twin); `short_name` to be listed
    by `kernel_classes()` (the CLI's name for it)."""

    name: ClassVar[str]
    # the math it computes: "forward", "backward" or "fused"; "reduce" and "sums" for the
    # reduction and the split's partial sums
    kind: ClassVar[str]
    source_file: ClassVar[str | None] = None  # default: f"{name}.cu"
    twin: ClassVar[type[Kernel] | None] = None  # the kernel a variant shares its math with
    # The second kernel of a pair names the first, launched before it on the same problem,
    # whose outputs it reads (the split kernels: cek/cosine_embedding_loss_split.py).
    first: ClassVar[type[Kernel] | None] = None
    args: ClassVar[tuple[Arg, ...]]
    max_block_size: ClassVar[int] = 1 << 20
    short_name: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        short = cls.__dict__.get("short_name")
        if short is not None:
            if short in _REGISTRY:
                raise ValueError(f"two kernel classes named {short!r}")
            _REGISTRY[short] = cls

    # The launch in words, as `cek list` prints it: written by _one_block_a_row_contract below
    # from the code that sizes launches, so that the text and launch_config cannot disagree.
    launch_contract: ClassVar[str]

    def __init__(self, block_size: int, dtype: str = "f32"):
        self.dtype = dtypes.get(dtype).name
        if not is_int(block_size):
            raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
        block_size = int(block_size)
        if block_size < 1 or block_size & (block_size - 1) or block_size > self.max_block_size:
            raise ValueError(
                f"block_size must be a power of two in [1, {self.max_block_size}], "
                f"got {block_size}"
            )
        self.block_size = block_size

    @classmethod
    def for_n_dim(cls, n_dim: int, dtype: str = "f32") -> "Kernel":
        """The instance whose BLOCK_SIZE fits rows of n_dim elements."""
        if not is_int(n_dim) or n_dim < 1:
            raise ValueError(f"n_dim must be a positive int, got {n_dim!r}")
        if n_dim > cls.max_block_size:
            raise ValueError(f"n_dim must be at most {cls.max_block_size}, got {n_dim}")
        return cls(next_power_of_two(n_dim), dtype)

    @classmethod
    def block_sizes(cls) -> list[int]:
        """Every supported BLOCK_SIZE, 1 to max_block_size."""
        return [1 << i for i in range(cls.max_block_size.bit_length())]

    # -- the documented fields ---------------------------------------------------------------

    @property
    def id(self) -> str:
        return "__".join((self.name, self.dtype, str(self.block_size)))

    @property
    def kernel_source(self) -> str:
        return load_kernel_source(self.source_file or f"{self.name}.cu")

    @property
    def entry_point_source(self) -> str:
        params = ", ".join(f"{self.c_type(a)} {a.name}" for a in self.args)
        names = ", ".join(a.name for a in self.args)
        element = "" if self.dtype == "f32" else f", {dtypes.get(self.dtype).c_type}"
        return (
            self._tiling_asserts()
            + f'extern "C" __global__ void __launch_bounds__({self.max_threads}, '
            f"{self._min_blocks_expression()}) "
            f"{self.entry_point_name()}({params}) {{\n"
            f"    {self.name}<{self.block_size}{element}>({names});\n"
            f"}}\n"
        )

    def _min_blocks_expression(self) -> str:
        """__launch_bounds__'s blocks an SM, as an expression of the arch NVRTC compiles for:
        min_blocks_on(arch) for each row of SM_LIMITS, the same values merged."""
        values = [(arch, self.min_blocks_on(arch)) for arch, _, _ in SM_LIMITS]
        merged = [values[0]]
        for arch, value in values[1:]:
            if value == merged[-1][1]:
                merged[-1] = (arch, value)  # the same value from this lower arch up
            else:
                merged.append((arch, value))
        text = str(merged[-1][1])
        for arch, value in reversed(merged[:-1]):
            text = f"__CUDA_ARCH__ >= {arch} ? {value} : {text}"
        return text

    def min_blocks_on(self, arch: int) -> int:
        """The blocks an SM the entry point asks of ptxas on `arch` (__CUDA_ARCH__, 800 for
        sm_80): min_blocks (or what a class asks below sm_80 or from sm_100 on), but 1 where
        that many blocks of max_threads do not fit the arch's SM (SM_LIMITS), whose ptxas would
        ignore the hint with a warning on every compile. A budget for fewer blocks there would
        be a register budget no spill test has held (tests/test_compile.py compiles sm_80 and
        sm_90, tests/test_nvrtc.py a few more archs)."""
        low, mid, high = self.min_blocks_before_sm80, self.min_blocks, self.min_blocks_from_sm100
        asked = high if arch >= 1000 else mid if arch >= 800 else low
        threads, blocks = sm_limits(arch)
        return asked if asked <= blocks and asked * self.max_threads <= threads else 1

    @property
    def min_blocks_from_sm100(self) -> int:
        """min_blocks on Blackwell (sm_100, sm_120 and the rest), whose ptxas budgets registers
        otherwise: min_blocks unless a class found it spills there (tests/test_nvrtc.py)."""
        return self.min_blocks

    @property
    def min_blocks_before_sm80(self) -> int:
        """min_blocks on sm_70 and sm_75, where a 16-bit narrowing takes an instruction a value
        (kernels/cek_types.cuh) and ptxas budgets registers otherwise: min_blocks unless a
        class found it spills there (tests/test_nvrtc.py compiles for sm_70 on NVRTC 12)."""
        return self.min_blocks

    def _tiling_asserts(self) -> str:
        """static_asserts that the tiling this class launches with is CekTiling's (cek_tiling.cuh):
        NVRTC and the emulator's g++ both refuse a kernel whose two mirrors disagree. None for
        a kernel not built on cek_row.cuh."""
        if "struct CekTiling" not in self.kernel_source:
            return ""
        tiling = f"CekTiling<{self.block_size}, {dtypes.get(self.dtype).c_type}>"
        facts = {"VEC": self.vec, "ROW_CHUNKS": self.row_chunks,
                 "STREAMED": str(self.streamed).lower(), "CHUNKS": self.chunks_per_thread,
                 "THREADS": self.threads(self.block_size),
                 "TAILED": str(self.tailed).lower(), "TAIL_THREADS": TAIL_THREADS}
        if isinstance(self, RowGroups):
            facts.update(GROUPED=str(self.grouped).lower(), GROUP=self.group)
            facts["GROUPED_THREADS"] = GROUPED_THREADS
        return "".join(
            f'static_assert({tiling}::{name} == {value}, "cek/kernel.py and CekTiling disagree '
            f'on {name}");\n' for name, value in facts.items())

    def c_type(self, arg: Arg) -> str:
        """The C type of `arg` for this kernel's dtype (T the element, A the accumulator)."""
        d = dtypes.get(self.dtype)
        if arg.ctype == "int":
            return "int"
        return arg.ctype.replace("T", d.c_type).replace("A", d.acc_c_type)

    def arg_dtype(self, arg: Arg) -> np.dtype:
        """The NumPy dtype of `arg` (for a pointer: of the array it points to)."""
        return _arg_dtype(self.dtype, arg)

    @property
    def source(self) -> str:
        return _source(self)

    def entry_point_name(self) -> str:
        return f"{self.name}_entry_point"

    def cache_key(self) -> str:
        """Content hash of `source`: the documented `id()` method (Python cannot have both)."""
        return _cache_key(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.block_size}, {self.dtype!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and (other.name, other.block_size, other.dtype) == (
            self.name, self.block_size, self.dtype)

    def __hash__(self) -> int:
        return hash((type(self), self.name, self.block_size, self.dtype))

    # -- launching ---------------------------------------------------------------------------

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        raise NotImplementedError

    # -- tiling: mirrors CekTiling in kernels/cek_tiling.cuh -------------------------------

    @property
    def vec(self) -> int:
        """Elements per 16-byte chunk."""
        return dtypes.get(self.dtype).vec

    @property
    def row_chunks(self) -> int:
        return max(1, self.block_size // self.vec)

    @property
    def streamed(self) -> bool:
        """True when a row is too wide for registers and 1024 threads loop over it: above 4096
        chunks per row, 2048 for 2-byte types (16384 elements; 8192 doubles)."""
        return self.block_size > register_path_width(self.dtype)

    @property
    def runs_twin_code(self) -> bool:
        """True where a variant only calls the kernel it is a variant of (see RowGroups)."""
        return False

    @property
    def max_threads(self) -> int:
        """The block size the entry point promises in __launch_bounds__: the most threads a row
        of BLOCK_SIZE elements takes (CekTiling::THREADS), so ptxas budgets registers for it;
        for a kernel without a launch contract (a test's probe), the most a block may have."""
        if not self._has_launch_contract():
            return MAX_THREADS
        return self.threads(self.block_size)

    @property
    def chunks_held(self) -> int:
        """Chunks of x1 (and as many of x2) each thread holds in registers."""
        return self.chunks_per_thread

    @property
    def min_blocks(self) -> int:
        """Blocks per SM the entry point asks ptxas to fit, by limiting its registers: enough for
        all 2048 threads an sm_80 or sm_90 SM holds (32 registers a thread), or for 3/4 of them
        (40), at most the SM's 32 blocks; 1 (no limit) where neither fits. What fits without
        spilling is ptxas's to say: this is the rule it gave on sm_80 and sm_90 for every kernel,
        dtype and BLOCK_SIZE (tests/test_compile.py holds it to 0 spills), by the chunk pairs a
        thread holds (chunks_held) and whether the kernel writes gradients:
          - more than two chunk pairs (float rows of 16384, double rows of 8192), or streamed: 1;
            but half for the four pairs a lane of 16-bit row groups (rows of 513..1024: 64);
          - the forward kernels: all threads;
          - gradient kernels in float: all threads; 3/4 for row groups of two pairs a lane;
          - in a 16-bit type: all threads for one pair a thread on one block per row (the
            conversions fit since the huge-row path reads the row again, cek_block_row), 3/4
            in row groups (one pair a lane: CEK_MAX_GROUPED_SIZE) and for two pairs below
            1024 threads (the gradient widens the held pairs again: cek_chunk_to_acc_again),
            1 for two pairs at 1024 threads (16384 elements: 3/4 is not a whole number of
            blocks there);
          - in double: 3/4 on one block per row below 1024 threads (there 3/4 is not a whole
            number of blocks), 1 otherwise."""
        itemsize = dtypes.get(self.dtype).array.itemsize
        held = self.chunks_held
        grouped = isinstance(self, RowGroups) and self.grouped
        if self.streamed or (held > 2 and not grouped):
            return 1
        if grouped and held == 4:  # 16-bit rows of 513..1024, a warp a row
            share = 0.5
        elif getattr(self, "kind", None) == "forward":  # a test's probe kernel may have no kind
            share = 1.0
        elif itemsize == 8:
            share = 0.75 if not grouped and self.max_threads < MAX_THREADS else None
        elif itemsize == 2:
            share = (0.75 if self.max_threads < MAX_THREADS else None) if held == 2 else \
                0.75 if grouped else 1.0
        else:
            share = 0.75 if grouped and held == 2 else 1.0
        if share is None:
            return 1
        resident = int(SM_THREADS * share)
        return min(MAX_BLOCKS_PER_SM, max(1, math.ceil(resident / self.max_threads)))

    @property
    def chunks_per_thread(self) -> int:
        """CekTiling::CHUNKS: BLOCK_SIZE/VEC/1024, at least 1, and at least 2 for float and 16-bit
        rows of 256 chunks or more (BLOCK_SIZE >= 1024 in float, 2048 in 16-bit types: twice the
        bytes in flight a thread, the row's once-a-thread work spread over twice the bytes;
        kernels/cek_tiling.cuh)."""
        if self.streamed:
            return 1
        least = 2 if dtypes.get(self.dtype).array.itemsize in (2, 4) and \
            self.row_chunks >= TWO_PAIRS_FROM_CHUNKS else 1
        return max(least, self.row_chunks // MAX_THREADS)

    @property
    def tailed(self) -> bool:
        """CekTiling::TAILED: rows that would take 704 or 736 threads (two blocks an SM) run
        TAIL_THREADS (three), each thread holding one element past its chunks at most. Float
        rows of 5377..5888 only: 16-bit ones hold two chunk pairs a thread, 384 threads at most."""
        return (not self.streamed and dtypes.get(self.dtype).array.itemsize == 4
                and self.block_size == 8192)

    def threads(self, n_dim: int) -> int:
        if self.streamed:
            return MAX_THREADS
        per_thread = self.vec * self.chunks_per_thread
        threads = WARP * math.ceil(math.ceil(n_dim / per_thread) / WARP)
        if self.tailed and TAIL_THREADS < threads < 768:
            return TAIL_THREADS
        return threads

    def _io_bytes(self, n_rows: int, n_dim: int, matrices: int, rows: int) -> int:
        """Bytes of `matrices` [N, D] arrays of T and `rows` [N] arrays of the accumulator."""
        d = dtypes.get(self.dtype)
        return matrices * d.array.itemsize * n_rows * n_dim + rows * d.acc.itemsize * n_rows

    def launch_config(self, n_rows: int, n_dim: int) -> tuple[tuple, tuple, int]:
        """(grid, block, shared_mem_bytes) for a problem of n_rows x n_dim."""
        for name, value in (("n_rows", n_rows), ("n_dim", n_dim)):
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
            if value >= 2**31:
                raise ValueError(f"{name} must be below 2^31 (the kernels take it as a 32-bit "
                                 f"int), got {value!r}")
        if next_power_of_two(n_dim) != self.block_size:
            raise ValueError(
                f"n_dim={n_dim} needs block_size={next_power_of_two(n_dim)}, "
                f"but this kernel has block_size={self.block_size}"
            )
        return self._grid_and_block(int(n_rows), int(n_dim)) + (0,)

    def _grid_and_block(self, n_rows: int, n_dim: int) -> tuple[tuple, tuple]:
        return (n_rows, 1, 1), (self.threads(n_dim), 1, 1)

    def check_launch(self, grid, block, n_rows: int, n_dim: int) -> None:
        """ValueError unless grid and block are `launch_config(n_rows, n_dim)`'s. A kernel trusts
        its launch: fewer blocks leave rows unwritten, other threads per block a wrong sum.
        Kernels of another kind (a test's probe) have no contract here and are not checked."""
        if not self._has_launch_contract():
            return
        want_grid, want_block, _ = self.launch_config(n_rows, n_dim)
        got_grid, got_block = dims3(grid), dims3(block)
        if (got_grid, got_block) != (want_grid, want_block):
            raise ValueError(
                f"{self.id}: grid {grid!r}, block {block!r} differ from launch_config({n_rows}, "
                f"{n_dim}) = grid {want_grid}, block {want_block}"
            )

    def check_launch_of(self, grid, block, cast: Sequence[Any]) -> None:
        """check_launch for the problem that checked arguments (check_args's result) describe."""
        if self._has_launch_contract():
            self.check_launch(grid, block, *self.problem_size(cast))

    def _has_launch_contract(self) -> bool:
        return getattr(self, "kind", None) in ("forward", "backward", "fused", "reduce", "sums")

    def check_args(self, args: Sequence[Any], array_types: tuple[type, ...]) -> tuple:
        """Check launch arguments against `args` and cast scalars to their C types.

        Arrays must be instances of `array_types` (NumPy for the emulator, CuPy for the GPU),
        of the argument's dtype, C-contiguous and of the shape its int arguments give.
        """
        if len(args) != len(self.args):
            raise TypeError(f"{self.name} takes {len(self.args)} arguments, got {len(args)}")
        scalars, pointers, shapes = _arg_plan(type(self), self.dtype)
        cast = list(args)
        for i, name, integral, c_type in scalars:
            value = args[i]
            if integral:
                if not is_int(value):
                    raise TypeError(f"{name} must be an int, got {type(value).__name__}")
                if not -(2**31) <= int(value) < 2**31:
                    raise ValueError(f"{name}={value} does not fit a 32-bit int")
            elif not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(
                value, (bool, np.bool_)
            ):
                raise TypeError(f"{name} must be a float, got {type(value).__name__}")
            cast[i] = c_scalar(c_type, value)
        shapes = [tuple(int(cast[j]) for j in dims) for dims in shapes]
        for i, spec, want, shape_at, stride_at in pointers:
            stride = None if stride_at is None else int(cast[stride_at])
            if stride not in (None, 0, 1):
                raise ValueError(f"{spec.stride} must be 0 (one {spec.name} for every row) or 1 "
                                 f"(one a row), got {stride}")
            value = args[i]
            if value is None and spec.optional:
                continue
            if not isinstance(value, array_types):
                names = " or ".join(f"{t.__module__}.{t.__name__}" for t in array_types)
                raise TypeError(f"{spec.name} must be a {names}, got {type(value).__name__}")
            if value.dtype != want:
                bits = " (bfloat16 bits)" if self.dtype == "bf16" and spec.ctype == "T*" else ""
                raise TypeError(f"{spec.name} must be {want}{bits}, got {value.dtype}")
            if shape_at is None:  # derived: the class says
                shape = self.derived_shape(spec, *self.problem_size(cast))
                if tuple(value.shape) != shape:
                    raise ValueError(f"{spec.name} must have shape {shape} for this problem "
                                     f"({self.derived_rule(spec)}), got {value.shape}")
            elif stride == 0:
                if value.size != 1:
                    raise ValueError(f"{spec.name} must hold one value for {spec.stride} = 0, "
                                     f"got shape {value.shape}")
            elif tuple(value.shape) != shapes[shape_at]:
                raise ValueError(f"{spec.name} must have shape ({', '.join(spec.shape)}) = "
                                 f"{shapes[shape_at]}, got {value.shape}")
            if not value.flags.c_contiguous:
                raise ValueError(f"{spec.name} must be C-contiguous")
            if spec.align and address(value) % spec.align:
                raise ValueError(f"{spec.name} must start at a multiple of {spec.align} bytes "
                                 f"(the kernel reads it {spec.align} bytes at a time), got "
                                 f"address {address(value):#x}")
        return tuple(cast)

    def problem_size(self, cast_args: Sequence[Any]) -> tuple[int, int]:
        n_rows, n_dim = _size_positions(type(self))
        return int(cast_args[n_rows]), int(cast_args[n_dim])

    def derived_shape(self, spec: Arg, n_rows: int, n_dim: int) -> tuple[int, ...]:
        """The shape of a `derived` pointer argument for an n_rows x n_dim problem."""
        raise NotImplementedError(f"{self.name} has no derived argument {spec.name}")

    def derived_rule(self, spec: Arg) -> str:
        """The rule of derived_shape, in words, for an error message."""
        return ""

    def arg_shape(self, spec: Arg, n_rows: int, n_dim: int) -> tuple[int, ...]:
        """The shape of pointer argument `spec` for an n_rows x n_dim problem."""
        if spec.derived:
            return self.derived_shape(spec, n_rows, n_dim)
        sizes = {"n_rows": n_rows, "n_dim": n_dim}
        return tuple(sizes[s] for s in spec.shape)


# -- the launch contract in words, from the code above ---------------------------------------

def _spans(values: list[tuple[int, int]]) -> str:
    """[(BLOCK_SIZE, value), ...] in order as "v (a..b), w (c)": runs of one value merged."""
    runs: list[list[int]] = []
    for block_size, value in values:
        if runs and runs[-1][2] == value:
            runs[-1][1] = block_size
        else:
            runs.append([block_size, block_size, value])
    return ", ".join(f"{v} ({a}..{b})" if a != b else f"{v} ({a})" for a, b, v in runs)


def _by_dtype(value, kernel_class: type | None = None) -> str:
    """A table by dtype of value(kernel) over every BLOCK_SIZE where it is not None, the dtypes
    of one table merged: "f32: 4 (1..512), 8 (1024); f16, bf16: ..."."""
    cls = kernel_class or Kernel
    tables: dict[str, list[str]] = {}
    for dtype in dtypes.DTYPES:
        values = [(b, value(cls(b, dtype))) for b in cls.block_sizes()]
        text = _spans([(b, v) for b, v in values if v is not None])
        tables.setdefault(text, []).append(dtype)
    return "; ".join(f"{', '.join(names)}: {text}" for text, names in tables.items())


def _one_block_a_row_contract() -> str:
    """The Kernel's launch in words, from threads() and the tiling it mirrors."""
    tails = " or ".join(str(t) for t in range(TAIL_THREADS + WARP, 768, WARP))
    tailed = ", ".join(f"{dtype} at BLOCK_SIZE {b}" for dtype in dtypes.DTYPES
                       for b in Kernel.block_sizes() if Kernel(b, dtype).tailed)
    widest: dict[int, list[str]] = {}
    for dtype in dtypes.DTYPES:
        widest.setdefault(register_path_width(dtype), []).append(dtype)
    streamed = "; ".join(f"{', '.join(names)}: {width}" for width, names in widest.items())
    elements = _by_dtype(lambda k: None if k.streamed else k.vec * k.chunks_per_thread)
    return (
        "grid [n_rows, 1, 1], one block per row; BLOCK_SIZE = next_power_of_two(n_dim); "
        "threads = 32 * ceil(n_dim / (32 * E)), E the elements a thread holds, by dtype and "
        f"BLOCK_SIZE: {elements}; but {TAIL_THREADS} where that gives {tails} ({tailed}: a "
        "thread then holds one element past its chunks); "
        f"{MAX_THREADS} threads, the row streamed, above BLOCK_SIZE {streamed}"
    )


def _row_groups_contract() -> str:
    """RowGroups' launch in words, from grouped and group, then the Kernel's for wider rows."""

    class Probe(RowGroups, Kernel):
        pass

    groups = _by_dtype(lambda k: k.group if k.grouped else None, Probe)
    return (
        "BLOCK_SIZE = next_power_of_two(n_dim); in row groups, GROUP lanes of a warp a row and "
        f"{GROUPED_THREADS} threads a block, grid [ceil(n_rows / ({GROUPED_THREADS} / GROUP)), "
        f"1, 1], with GROUP by dtype and BLOCK_SIZE: {groups}; at any other BLOCK_SIZE one "
        "block per row, as the backward kernel: " + Kernel.launch_contract
    )


Kernel.launch_contract = _one_block_a_row_contract()
RowGroups.launch_contract = _row_groups_contract()


# The modules whose classes set `short_name`, in the order kernel_classes lists them.
KERNEL_MODULES = ("cek.cosine_embedding_loss_backward", "cek.cosine_embedding_loss_forward",
                  "cek.cosine_embedding_loss_fused", "cek.cosine_embedding_loss_split")


def kernel_classes() -> dict[str, type[Kernel]]:
    """Every kernel class by its short CLI name ("backward", "forward", ...): the classes that
    set `short_name`, which register themselves when their module is imported (imported here),
    kernels first, then the variants, each in KERNEL_MODULES' order and then in the order they
    were defined, whichever module a caller imported first."""
    import importlib

    position = {module: i for i, module in enumerate(KERNEL_MODULES)}
    for module in KERNEL_MODULES:
        importlib.import_module(module)
    ordered = sorted(_REGISTRY.items(), key=lambda item: (
        item[1].twin is not None, position.get(item[1].__module__, len(position))))
    return dict(ordered)


# Memoized per kernel (equal kernels share them): the template is read once per process
# (load_kernel_source), so neither can change, and a GPU launch asks for the key every time.
@functools.lru_cache(maxsize=None)
def _source(kernel: Kernel) -> str:
    return kernel.kernel_source + "\n\n" + kernel.entry_point_source


@functools.lru_cache(maxsize=None)
def _cache_key(kernel: Kernel) -> str:
    return hashlib.sha256(_source(kernel).encode()).hexdigest()
