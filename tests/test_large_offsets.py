"""64-bit row offsets: every kernel on the last rows of a problem of more than 2^31 elements.

Each [n_rows, n_dim] array is 8 GiB of address space, mapped with MAP_NORESERVE so that only the
pages written cost memory. The test fills the rows the last 2 blocks of the grid cover and runs
only those blocks (the emulator's first_block). A row offset computed in 32-bit int wraps 2^32
elements (16 GiB of floats) back, into another array or into unmapped memory, so each case runs
in a subprocess: a crash fails the test instead of killing pytest.
"""

import math
import mmap
import platform
import signal
import subprocess
import sys

import numpy as np
import pytest

from cek import check, emulate
from cek.emulate import KernelError, sanitize as sanitized
from cek.kernel import kernel_classes

pytestmark = pytest.mark.emulator

# Python < 3.13 has no mmap.MAP_NORESERVE: 0x4000 is Linux's value on x86-64 and Arm64.
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE",
                        0x4000 if platform.machine() in ("x86_64", "aarch64") else 0)
# One block per row, and a width on the row-group path (fused, *_rows: several rows a block).
DIMS = [768, 64]
MARGIN = 0.25
TIMEOUT_S = 300


def rows_per_block(kernel, n_dim):
    """Rows one block covers, from the grid the kernel launches: [ceil(n_rows / rows), 1, 1]."""
    n = 1 << 20
    grid, _, _ = kernel.launch_config(n, n_dim)
    rows = math.ceil(n / grid[0])
    assert kernel.launch_config(rows, n_dim)[0] == (1, 1, 1)
    assert kernel.launch_config(rows + 1, n_dim)[0] == (2, 1, 1)
    return rows


def mapped(shape, dtype):
    """A zero array over an anonymous mapping: untouched pages cost no memory."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
    return np.frombuffer(buffer, dtype).reshape(shape)


def last_rows_args(kernel, inputs, n_rows, first_row):
    """Launch args in the kernel's order for n_rows rows, with `inputs` in rows first_row.. and
    NaN in the outputs there (returned by name, those rows only)."""
    n_dim = inputs["x1"].shape[1]
    sizes = {"n_rows": n_rows, "n_dim": n_dim}
    args, outputs = [], {}
    for spec in kernel.args:
        value = inputs.get(spec.name)
        if not spec.is_pointer:
            args.append(sizes[spec.name] if spec.name in sizes
                        else MARGIN if spec.name == "margin" else value)
            continue
        if value is None and spec.optional and not spec.output:  # an output is judged
            args.append(None)
            continue
        shape = kernel.arg_shape(spec, n_rows, n_dim)
        # Per-row arrays are small (np.zeros leaves the pages it does not need untouched too),
        # the split's partial sums too: S rows of them a row.
        array = mapped(shape, kernel.arg_dtype(spec)) if len(shape) > 1 and not spec.derived \
            else np.zeros(shape, kernel.arg_dtype(spec))
        first = first_row * (shape[0] // n_rows)
        array[first:] = np.nan if spec.output else value
        if spec.output:
            outputs[spec.name] = array[first:]
        args.append(array)
    return tuple(args), outputs


def run_last_blocks(name, n_dim):
    """Run the last 2 blocks of kernel `name` (float32) on rows past element 2^31; the failures."""
    kernel = kernel_classes()[name].for_n_dim(n_dim)
    rows = rows_per_block(kernel, n_dim)
    # A few rows over 2 blocks past the first row whose offset needs 64 bits, so the last block
    # is partial where a block holds several rows.
    n_rows = math.ceil(2**31 / n_dim) + 2 * rows + 3
    grid, block, smem = kernel.launch_config(n_rows, n_dim)
    assert grid[1:] == (1, 1), grid
    first_row = (grid[0] - 2) * rows
    assert first_row * n_dim >= 2**31, (first_row, n_dim)
    inputs = check.make_inputs(n_rows - first_row, n_dim, seed=n_dim)
    inputs["scale"] = 0.5
    args, outputs = last_rows_args(kernel, inputs, n_rows, first_row)
    emulate.load(kernel)(grid, block, args, shared_mem=smem, first_block=grid[0] - 2)
    want, size = check.expected(kernel, inputs, MARGIN)
    return check.compare(outputs, want, size, kernel.dtype)[2]


@pytest.fixture(scope="module")
def address_space():
    """Skip where the kernel will not map 8 GiB arrays without backing them (strict overcommit,
    or no MAP_NORESERVE)."""
    try:
        probe = mapped((4, 2**31), np.float32)
    except (OSError, ValueError, OverflowError) as exc:
        pytest.skip(f"cannot map 4 x 8 GiB of address space here: {exc}")
    del probe


def run_split_last_rows(name):
    """The split pair `name` (float32) on its last 3 rows past element 2^31, four slices a row:
    the partial sums' last 3*S blocks, then those of the second launch that take those rows (its
    first 3*S blocks, which run the slices in reverse; a block a row for the forward)."""
    from cek import cosine_embedding_loss_split as split

    kernel = kernel_classes()[name].for_dtype()
    n_dim = 3 * split.slice_width("f32") + 5
    slices, last = split.slices(n_dim, "f32"), 3
    n_rows = math.ceil(2**31 / n_dim) + last
    first_row = n_rows - last
    assert first_row * n_dim >= 2**31 - n_dim
    inputs = check.make_inputs(last, n_dim, seed=5)
    inputs["scale"] = 0.5
    sums_kernel = kernel.first.for_dtype()
    args, outputs = last_rows_args(sums_kernel, inputs, n_rows, first_row)
    grid, block, _ = sums_kernel.launch_config(n_rows, n_dim)
    # two slices a block: the first block that reads a slice of the last rows
    first_block = first_row * slices // split.SUMS_SLICES
    emulate.load(sums_kernel)(grid, block, args, first_block=first_block)
    inputs["sums"] = outputs["sums"]
    args, outputs = last_rows_args(kernel, inputs, n_rows, first_row)
    grid, block, _ = kernel.launch_config(n_rows, n_dim)
    per_slice = kernel.per_slice
    emulate.load(kernel)(grid, block, args, first_block=0 if per_slice else first_row,
                         blocks=last * slices if per_slice else None)
    want, size = check.expected(kernel, inputs, MARGIN)
    return check.compare(outputs, want, size, kernel.dtype)[2]


# Row indices at the top of int: n_rows within a row group's trip of 2^31 (the kernels take
# n_rows below 2^31), rows of one element. A row index formed past the last row there does not
# fit an int: the keep kernel's row-group loop stepped to trip + 256 past it.
TOP_ROWS = 2**31 - 100


def run_top_rows(name):
    """Run the last 2 blocks of kernel `name` (float32, D = 1) at TOP_ROWS rows; the failures."""
    kernel = kernel_classes()[name].for_n_dim(1)
    rows = rows_per_block(kernel, 1)
    grid, block, smem = kernel.launch_config(TOP_ROWS, 1)
    first_row = (grid[0] - 2) * rows
    assert TOP_ROWS - first_row <= 2 * rows  # a partial last block where a block holds several
    inputs = check.make_inputs(TOP_ROWS - first_row, 1, seed=3)
    inputs["scale"] = 0.5
    args, outputs = last_rows_args(kernel, inputs, TOP_ROWS, first_row)
    emulate.load(kernel)(grid, block, args, shared_mem=smem, first_block=grid[0] - 2)
    want, size = check.expected(kernel, inputs, MARGIN)
    return check.compare(outputs, want, size, kernel.dtype)[2]


def _in_a_process(*argv):
    done = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    how = f"crashed ({signal.Signals(-done.returncode).name})" if done.returncode < 0 else \
        f"exited with status {done.returncode}"
    assert done.returncode == 0, f"{argv} {how}\n{done.stdout}{done.stderr[-4000:]}"


ONE_BLOCK = [name for name, cls in kernel_classes().items() if not hasattr(cls, "per_slice")]
SPLIT = [name for name, cls in kernel_classes().items() if cls.first is not None]


@pytest.mark.parametrize("n_dim", DIMS)
@pytest.mark.parametrize("name", ONE_BLOCK)
def test_rows_past_element_2_31(address_space, name, n_dim):
    emulate.load(kernel_classes()[name].for_n_dim(n_dim))  # a compile error shows here, as itself
    _in_a_process(name, str(n_dim))


@pytest.mark.parametrize("name", SPLIT)
def test_split_rows_past_element_2_31(address_space, name):
    emulate.load(kernel_classes()[name].for_dtype())
    _in_a_process("split", name)


@pytest.mark.parametrize("name", ONE_BLOCK)
def test_rows_at_the_top_of_int(address_space, name):
    emulate.load(kernel_classes()[name].for_n_dim(1))
    _in_a_process("top", name)


# -- first_block itself ---------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["forward", "reverse", "random:1"])
@pytest.mark.parametrize("name", ONE_BLOCK)
def test_first_block_runs_the_blocks_from_there_on(name, schedule):
    kernel = kernel_classes()[name].for_n_dim(64)
    rows = rows_per_block(kernel, 64)
    n_rows, first = 3 * rows + 5, 2  # blocks 2 and 3 run; the last is partial with row groups
    inputs = check.make_inputs(n_rows, 64)
    args, outputs = check.build_args(kernel, inputs, MARGIN)
    grid, block, smem = kernel.launch_config(n_rows, 64)
    emulate.load(kernel, schedule=schedule)(grid, block, args, shared_mem=smem, first_block=first)
    for output, out in outputs.items():
        assert np.isnan(out[:first * rows]).all(), f"{output}: a block before first_block ran"
    want, size = check.expected(kernel, inputs, MARGIN)
    got, want, size = ({k: v[first * rows:] for k, v in d.items()} for d in (outputs, want, size))
    assert not check.compare(got, want, size, kernel.dtype)[2]


def test_bad_first_block_is_rejected_with_its_value():
    kernel = kernel_classes()["forward"].for_n_dim(64)
    n_rows = 4
    args, _ = check.build_args(kernel, check.make_inputs(n_rows, 64), MARGIN)
    grid, block, _ = kernel.launch_config(n_rows, 64)
    launch = emulate.load(kernel)
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match=f"first_block.*{bad}"):
            launch(grid, block, args, first_block=bad)
    for bad in (n_rows, n_rows + 7):
        with pytest.raises(KernelError, match=f"first_block={bad} is not below the grid's 4"):
            launch(grid, block, args, first_block=bad)


def test_blocks_runs_that_many_and_no_more():
    kernel = kernel_classes()["forward"].for_n_dim(64)
    n_rows = 6
    inputs = check.make_inputs(n_rows, 64)
    args, outputs = check.build_args(kernel, inputs, MARGIN)
    grid, block, _ = kernel.launch_config(n_rows, 64)
    launch = emulate.load(kernel)
    launch(grid, block, args, first_block=1, blocks=3)  # rows 1, 2 and 3
    ran = ~np.isnan(outputs["out"])
    assert ran.tolist() == [False, True, True, True, False, False]
    want, size = check.expected(kernel, inputs, MARGIN)
    assert not check.compare({"out": outputs["out"][ran]}, {"out": want["out"][ran]},
                             {"out": size["out"][ran]})[2]
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="blocks"):
            launch(grid, block, args, blocks=bad)
    with pytest.raises(KernelError, match="blocks 4 .. 6 are past the grid's 6 blocks"):
        launch(grid, block, args, first_block=4, blocks=3)


def test_first_block_needs_the_plain_emulator():
    try:
        sanitized._preload("address")
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"sanitize='address' unavailable: {exc}")
    kernel = kernel_classes()["backward"].for_n_dim(129)  # the library test_emulate builds
    args, _ = check.build_args(kernel, check.make_inputs(3, 129), MARGIN)
    grid, block, _ = kernel.launch_config(3, 129)
    with pytest.raises(ValueError, match="first_block=1, blocks=None need sanitize=None"):
        emulate.load(kernel, sanitize="address")(grid, block, args, first_block=1)


if __name__ == "__main__":  # one case of the tests past element 2^31, in its own process
    failures = (run_split_last_rows(sys.argv[2]) if sys.argv[1] == "split"
                else run_top_rows(sys.argv[2]) if sys.argv[1] == "top"
                else run_last_blocks(sys.argv[1], int(sys.argv[2])))
    print("\n".join(failures) or "ok")
    sys.exit(1 if failures else 0)
