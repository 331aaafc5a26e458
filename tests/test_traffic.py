"""Global-memory traffic, counted byte by byte on the emulator (cek.emulate.traffic).

Proves the bytes formula the benchmark turns into GB/s (Kernel.bytes_moved) and the property the
kernels are built around: on the register path and in row groups x1 and x2 are read from global
memory once, on the streamed path a gradient kernel reads them twice, and every output byte is
written exactly once. A probe kernel first shows that the counter sees what it must: 128-bit and
scalar accesses through the kernels' own chunk functions, and nothing of shared memory or stack.
"""

import numpy as np
import pytest

from cek import check
from cek.kernel import Arg, Kernel, kernel_classes
from cek.sources import load_kernel_source

emulate = pytest.importorskip("cek.emulate")
from cek.emulate import KernelError  # noqa: E402

pytestmark = pytest.mark.emulator

N_ROWS = 7  # a row-group block holds 8 rows or more: lanes of dead rows must read nothing
# Row groups (33: scalar tail, 256: 128-bit), one block per row (769, 4096; 5888: 672 threads,
# each holding an element past its chunks), streamed (16385: scalar, 16392: 128-bit), and "4096+1",
# "5600+1": views one element into their buffers (scalar path).
WIDTHS = [33, 256, 769, 4096, "4096+1", 5888, "5600+1", 16385, 16392]
DTYPES = ["f32", "bf16", "f64"]


def misaligned(array):
    """The same values in a view one element into a buffer: rows not 16-byte aligned."""
    view = np.empty(array.size + 1, array.dtype)[1:].reshape(array.shape)
    view[...] = array
    return view


def run(kernel, inputs, margin=0.25):
    """Launch `kernel` under the traffic counter; check its outputs against float64 as well. The
    second kernel of a pair runs after the first, whose traffic is asserted too."""
    n_rows, n_dim = inputs["x1"].shape
    if kernel.first is not None:
        first = kernel.first.for_n_dim(n_dim, kernel.dtype)
        counts, outputs = counted(first, inputs, margin)
        assert_traffic(first, counts, n_rows, n_dim)
        inputs = {**inputs, **outputs}
    return counted(kernel, inputs, margin)[0]


def counted(kernel, inputs, margin):
    """(traffic, outputs) of one launch of `kernel`, its outputs checked against float64."""
    n_rows, n_dim = inputs["x1"].shape
    args, outputs = check.build_args(kernel, inputs, margin)
    grid, block, smem = kernel.launch_config(n_rows, n_dim)
    counts = emulate.traffic(kernel, grid, block, args, shared_mem=smem)
    _, _, failures = check.compare(outputs, *check.expected(kernel, inputs, margin), kernel.dtype)
    assert not failures, failures
    return counts, outputs


def assert_traffic(kernel, counts, n_rows, n_dim):
    """The traffic the kernel's header promises, and its bytes formula equal to what it moves."""
    matrices = {a.name for a in kernel.args if a.shape == ("n_rows", "n_dim") and not a.derived}
    # A gradient kernel reads a streamed row twice (sums, then gradient); the forward one once.
    # Each of the split's kernels reads it once: its pair twice, the first for the sums.
    passes = 2 if kernel.streamed and kernel.kind != "forward" else 1
    # The split's partials: each read by the blocks of its row, S in a gradient kernel, and
    # counted once by bytes_moved (after the first, from L2).
    readers = kernel.slices(n_dim) if getattr(kernel, "per_slice", False) else 1
    moved = 0
    for spec in kernel.args:
        if not spec.is_pointer or spec.name not in counts:
            continue
        t = counts[spec.name]
        if spec.output:
            assert (t.written, t.writes, t.read) == (t.size, (1, 1), 0), (spec.name, t)
        elif spec.derived:
            assert (t.read, t.reads, t.written) == (t.size, (readers, readers), 0), (spec.name, t)
        elif spec.name in matrices:
            assert (t.read, t.reads, t.written) == (t.size, (passes, passes), 0), (spec.name, t)
        else:  # a per-row value: every lane of a row may read it (a broadcast on a GPU)
            assert t.read == t.size and t.reads[0] >= 1 and t.written == 0, (spec.name, t)
        if spec.name in matrices:
            moved += t.read * t.reads[1] + t.written * t.writes[1]
        else:
            moved += t.read + t.written
    want = kernel.bytes_moved(n_rows, n_dim)
    if kernel.kind == "fused":  # bytes_moved is cek.torch's step of a mean or a sum (the loss and
        # the labels' copy written, no dy); the .cu adds S*N for a dy a row or a loss_out
        want += sum(counts[name].size for name in ("dy", "loss_out") if name in counts)
    assert moved == want, f"{kernel.id}: moves {moved} bytes, bytes_moved says {want}"


# The split's kernels: one slice (33), a whole one (4096 floats), a ragged and a misaligned
# last slice, several (16385: 5 slices of floats, 3 of bf16, 9 of doubles).
SPLIT_WIDTHS = [33, 4096, "4096+1", 16385, 16392]


def _cases():
    for name, cls in kernel_classes().items():
        for dtype in DTYPES:
            for width in SPLIT_WIDTHS if hasattr(cls, "per_slice") else WIDTHS:
                for dy in ("dy", "no_dy") if cls.kind == "fused" else ("",):
                    yield pytest.param(cls, dtype, width, dy,
                                       id="-".join(filter(None, (name, dtype, str(width), dy))))


@pytest.mark.parametrize("cls, dtype, width, dy", list(_cases()))
def test_traffic_is_what_the_header_and_bytes_moved_say(cls, dtype, width, dy):
    n_dim = int(str(width).removesuffix("+1"))
    kernel = cls.for_n_dim(n_dim, dtype)
    inputs = check.make_inputs(N_ROWS, n_dim, dtype=dtype)
    if dy == "no_dy":
        inputs["dy"] = None  # then the kernel must not touch dy at all (a KernelError if it does)
    if str(width).endswith("+1"):
        inputs["x1"], inputs["x2"] = misaligned(inputs["x1"]), misaligned(inputs["x2"])
    counts = run(kernel, inputs)
    pointers = {a.name for a in kernel.args if a.is_pointer}
    assert set(counts) == (pointers - {"dy"} if dy == "no_dy" else pointers)
    assert_traffic(kernel, counts, N_ROWS, n_dim)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_dim", [33, 769, 16392])
def test_traffic_of_a_mean_is_the_fused_kernels_then_the_reductions(dtype, n_dim):
    """A mean (or sum) is the fused kernel, which writes each row's loss once, then the
    reduction, which reads each once and writes the result: the per-row losses cost A bytes a
    row twice, beside the row kernel's bytes_moved, and nothing else does. (N_ROWS losses are
    one launch; the two levels' traffic: tests/test_cosine_embedding_loss_reduce.py.)"""
    from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
    from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce

    fused = CosineEmbeddingLossFused.for_n_dim(n_dim, dtype)
    inputs = dict(check.make_inputs(N_ROWS, n_dim, dtype=dtype), dy=None, scale=1 / N_ROWS)
    args, outputs = check.build_args(fused, inputs, 0.25)
    counts = emulate.traffic(fused, *fused.launch_config(N_ROWS, n_dim)[:2], args)
    assert_traffic(fused, counts, N_ROWS, n_dim)
    reduction = CosineEmbeddingLossReduce.for_dtype(dtype)
    loss = outputs["loss"]
    reduced = np.zeros((), reduction.arg_dtype(reduction.args[1]))
    second = emulate.traffic(reduction, *reduction.launch_config(N_ROWS)[:2],
                             (loss, reduced, N_ROWS, 1 / N_ROWS, None))
    assert (counts["loss"].written, second["loss"].read, second["loss"].reads) == \
        (loss.nbytes, loss.nbytes, (1, 1))
    assert second["reduced"].written == reduced.nbytes
    assert loss.nbytes + reduced.nbytes == reduction.bytes_moved(N_ROWS)


# -- the counter itself ------------------------------------------------------------------------

PROBE = load_kernel_source("cek_row.cuh") + r'''
// Each thread copies chunk threadIdx.x of row blockIdx.x from x to out with the kernels' own
// cek_load_chunk / cek_store_chunk (mode 0: 128-bit accesses, 1: scalar), by way of shared
// memory and a copy on the stack, which are not global traffic. Mode 2 copies the row with a
// memcpy of a size known only at run time (a library call), mode 3 reads `absent`.
template <int BLOCK_SIZE, typename T = float>
__device__ void traffic_probe(const T* __restrict__ x, const T* __restrict__ absent,
                              T* __restrict__ out, int n_rows, int n_dim, int mode) {
    const long long offset = static_cast<long long>(blockIdx.x) * n_dim;
    if (mode == 2) {
        if (threadIdx.x == 0) __builtin_memcpy(out + offset, x + offset, n_dim * sizeof(T));
        return;
    }
    __shared__ CekChunk<T> staged[CEK_MAX_THREADS];
    staged[threadIdx.x] = cek_load_chunk((mode == 3 ? absent : x) + offset, threadIdx.x, n_dim,
                                         mode == 0);
    __syncthreads();
    const CekChunk<T> copy = staged[threadIdx.x];
    cek_store_chunk(out + offset, threadIdx.x, n_dim, mode == 0, copy);
}
'''


class Probe(Kernel):
    name = "traffic_probe"
    kind = "probe"
    args = (Arg("x", "T*", ("n_rows", "n_dim")), Arg("absent", "T*", ("n_rows", "n_dim"),
                                                    optional=True),
            Arg("out", "T*", ("n_rows", "n_dim"), output=True), Arg("n_rows", "int"),
            Arg("n_dim", "int"), Arg("mode", "int"))

    @property
    def kernel_source(self) -> str:
        return PROBE


def run_probe(dtype, n_dim, mode, n_rows=3):
    probe = Probe(64, dtype)
    x = np.arange(n_rows * n_dim).reshape(n_rows, n_dim).astype(probe.arg_dtype(probe.args[0]))
    out = np.zeros_like(x)
    threads = -(-n_dim // probe.vec)
    counts = emulate.traffic(probe, (n_rows,), (threads,), (x, None, out, n_rows, n_dim, mode))
    return x, out, counts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode, n_dim", [(0, 64), (1, 64), (1, 63)], ids=["128-bit", "scalar",
                                                                             "scalar-tail"])
def test_the_counter_sees_128_bit_and_scalar_accesses_and_nothing_else(dtype, mode, n_dim):
    x, out, counts = run_probe(dtype, n_dim, mode)
    assert np.array_equal(out, x)
    assert set(counts) == {"x", "out"}  # `absent` is None, and not touched
    assert (counts["x"].read, counts["x"].reads, counts["x"].written) == (x.nbytes, (1, 1), 0)
    assert (counts["out"].written, counts["out"].writes, counts["out"].read) == \
        (out.nbytes, (1, 1), 0)


@pytest.mark.parametrize("mode, what", [(2, "calls memcpy on out"),
                                        (3, "reads absent, which is None")])
def test_what_the_counter_cannot_count_fails_the_launch(mode, what):
    with pytest.raises(KernelError, match=what):
        run_probe("f32", 64, mode)
