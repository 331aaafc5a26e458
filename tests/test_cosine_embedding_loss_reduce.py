"""cosine_embedding_loss_reduce: the mean or sum of the per-row losses, in a fixed order: one
block, or above two trips of it a block per slice into partials and one block over those.

The order is the kernel's alone (kernels/cosine_embedding_loss_reduce.cu), so `model` and
`two_level_model` below add in that order in NumPy, float by float: the kernel must give its
bits exactly, on the emulator and on a GPU, whatever the schedule, alignment or N, and land
within TOLERANCES of the float64 mean or sum. Then the pair a mean or sum runs: the fused or
forward-rows kernel's per-row losses, reduced, against the float64 reference of the whole loss.
"""

import numpy as np
import pytest

from cek import check, dtypes
from cek.compile import compile_kernel
from cek.cosine_embedding_loss_forward import CosineEmbeddingLossForwardRows
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
from cek.cosine_embedding_loss_reduce import THREADS, CosineEmbeddingLossReduce

DTYPES = ("f32", "f64", "f16", "bf16")
WARP = 32


def block_total(loss: np.ndarray):
    """One block's sum, added in the kernel's order: thread t takes the 16-byte chunks t,
    t + 1024, ... (the last chunk padded with zeros), element by element; a butterfly over each
    warp's lanes, then over the warps. In the accumulation type, unscaled."""
    acc = loss.dtype.type
    vec = 16 // loss.dtype.itemsize
    chunks = np.zeros(-(-len(loss) // vec) * vec, acc)
    chunks[:len(loss)] = loss
    chunks = chunks.reshape(-1, vec)
    sums = np.zeros(THREADS, acc)
    for first in range(0, len(chunks), THREADS):  # chunk first + t is thread t's
        trip = chunks[first:first + THREADS]
        for i in range(vec):
            sums[:len(trip)] += trip[:, i]  # one float add a thread, as the kernel
    lanes = np.arange(WARP)
    warps = sums.reshape(-1, WARP)
    for offset in (16, 8, 4, 2, 1):
        warps = warps + warps[:, lanes ^ offset]
    total = warps[:, 0]
    for offset in (16, 8, 4, 2, 1):
        total = total + total[lanes ^ offset]
    return total[0]


def model(loss: np.ndarray, scale: float, dtype: str) -> np.ndarray:
    """One block's result: scale times its total, in the accumulation type, rounded to `dtype`
    once (0-d; bfloat16 as its bits)."""
    acc = loss.dtype.type
    result = np.asarray(acc(scale) * block_total(loss))
    if dtype == "bf16":
        return dtypes.from_float(result, dtype)
    with np.errstate(over="ignore"):  # a float16 sum past 65504 is inf, as the kernel's
        return result.astype(dtypes.get(dtype).array)


def slice_rows(dtype: str) -> int:
    """A first-level block's losses: one trip of 1024 threads, 8 chunks of 16 bytes each."""
    return 8 * THREADS * 16 // dtypes.get(dtype).acc.itemsize


def partials_model(loss: np.ndarray, dtype: str) -> np.ndarray:
    """The first level's partials: each slice's block_total, unscaled."""
    step = slice_rows(dtype)
    return np.array([block_total(loss[i:i + step]) for i in range(0, len(loss), step)],
                    loss.dtype)


def two_level_model(loss: np.ndarray, scale: float, dtype: str) -> np.ndarray:
    """The second level's result: one block over the partials, then scaled and rounded."""
    return model(partials_model(loss, dtype), scale, dtype)


def losses(n: int, dtype: str, seed: int = 0) -> np.ndarray:
    """Per-row losses as the row kernels write them: in [0, 2], every fourth row 0 (a label not
    +-1), in the accumulation type."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(0.0, 2.0, n)
    values[::4] = 0.0
    return values.astype(dtypes.get(dtype).acc)


def want(loss: np.ndarray, reduction: str) -> tuple[float, float]:
    """(float64 mean or sum, the size it is judged by: 1 for a mean, N for a sum)."""
    total = np.sum(loss.astype(np.float64))
    n = len(loss)
    if reduction == "mean":
        return total / n, 1.0
    return total, float(n)


def scale_of(n: int, reduction: str) -> float:
    return 1.0 / n if reduction == "mean" else 1.0


def test_one_kernel_per_dtype_of_blocks_of_1024():
    kernel = CosineEmbeddingLossReduce.for_dtype("bf16")
    assert kernel == CosineEmbeddingLossReduce.for_n_dim(768, "bf16") == \
        CosineEmbeddingLossReduce(1024, "bf16")
    assert kernel.id == "cosine_embedding_loss_reduce__bf16__1024"
    assert kernel.launch_config(0) == kernel.launch_config(65536, 768) == \
        kernel.launch_config(1 << 20) == ((1, 1, 1), (1024, 1, 1), 0)
    # with partials: a block per slice of 32768 float losses (16384 doubles)
    assert kernel.launch_config(1, None, True) == kernel.launch_config(32768, None, True) == \
        ((1, 1, 1), (1024, 1, 1), 0)
    assert kernel.launch_config(32769, None, True)[0] == (2, 1, 1)
    assert kernel.launch_config(1 << 20, 128, True)[0] == (32, 1, 1)
    assert CosineEmbeddingLossReduce.for_dtype("f64").launch_config(1 << 20, None, True)[0] == \
        (64, 1, 1)
    assert "__launch_bounds__(1024, 1)" in kernel.entry_point_source
    assert kernel.bytes_moved(65536) == 4 * 65536 + 2
    assert CosineEmbeddingLossReduce.for_dtype("f64").bytes_moved(10) == 8 * 10 + 8
    # two levels: the partials written once and read once
    assert kernel.bytes_moved(65537) == 4 * (65537 + 2 * 3) + 2
    assert kernel.bytes_moved(1 << 20) == 4 * ((1 << 20) + 2 * 32) + 2
    with pytest.raises(ValueError, match="partials needs n_rows >= 1, got 0"):
        kernel.launch_config(0, None, True)
    with pytest.raises(ValueError, match="block_size must be 1024, got 512"):
        CosineEmbeddingLossReduce(512)
    with pytest.raises(ValueError, match=r"n_rows must be an int in \[0, 2\^31\), got -1"):
        kernel.launch_config(-1)


def test_launch_arguments_are_checked():
    kernel = CosineEmbeddingLossReduce.for_dtype("f32")
    reduced = np.zeros((), np.float32)
    kernel.check_args((np.zeros(5, np.float32), reduced, 5, 0.2, None), (np.ndarray,))
    with pytest.raises(ValueError, match=r"loss must have shape \(n_rows\) = \(5,\)"):
        kernel.check_args((np.zeros(6, np.float32), reduced, 5, 0.2, None), (np.ndarray,))
    with pytest.raises(TypeError, match="reduced must be float32, got float64"):
        kernel.check_args((np.zeros(5, np.float32), np.zeros(()), 5, 0.2, None), (np.ndarray,))
    with pytest.raises(TypeError, match="takes 5 arguments, got 4"):
        kernel.check_args((np.zeros(5, np.float32), reduced, 5, 0.2), (np.ndarray,))
    with pytest.raises(ValueError, match=r"grid \(2, 1, 1\), block \(1024, 1, 1\) differ"):
        kernel.check_launch((2, 1, 1), (1024, 1, 1), 5, None)


def test_partials_are_checked_and_set_the_grid():
    """The grid a launch's arguments call for: one block without partials for any n_rows,
    ceil(n_rows / 32768) with them, each refused for the other."""
    kernel = CosineEmbeddingLossReduce.for_dtype("f32")
    n = 3 * 32768 + 5
    loss, reduced = np.zeros(n, np.float32), np.zeros((), np.float32)
    one = kernel.check_args((loss, reduced, n, 0.5, None), (np.ndarray,))
    two = kernel.check_args((loss, reduced, n, 0.5, np.zeros(4, np.float32)), (np.ndarray,))
    assert kernel.problem_size(one) == (n, None, False) and kernel.problem_size(two)[2] is True
    kernel.check_launch_of((1, 1, 1), (1024, 1, 1), one)
    kernel.check_launch_of((4, 1, 1), (1024, 1, 1), two)
    with pytest.raises(ValueError, match=r"grid \(1, 1, 1\), .* grid \(4, 1, 1\), .*\(with "
                                         r"partials\)"):
        kernel.check_launch_of((1, 1, 1), (1024, 1, 1), two)
    with pytest.raises(ValueError, match=r"grid \(4, 1, 1\), .* grid \(1, 1, 1\), .*\(without "
                                         r"partials\)"):
        kernel.check_launch_of((4, 1, 1), (1024, 1, 1), one)
    with pytest.raises(ValueError, match=r"partials must have shape \(ceil\(n_rows / 32768\),\) "
                                         r"= \(4,\), got \(3,\)"):
        kernel.check_args((loss, reduced, n, 0.5, np.zeros(3, np.float32)), (np.ndarray,))
    with pytest.raises(TypeError, match="partials must be float32, got float64"):
        kernel.check_args((loss, reduced, n, 0.5, np.zeros(4)), (np.ndarray,))
    with pytest.raises(TypeError, match="partials must be a numpy.ndarray or None, got list"):
        kernel.check_args((loss, reduced, n, 0.5, [0.0] * 4), (np.ndarray,))
    with pytest.raises(ValueError, match="partials must be C-contiguous"):
        kernel.check_args((loss, reduced, n, 0.5, np.zeros(8, np.float32)[::2]), (np.ndarray,))
    with pytest.raises(ValueError, match=r"loss must have shape \(n_rows\)"):  # the rest too
        kernel.check_args((loss[1:], reduced, n, 0.5, np.zeros(4, np.float32)), (np.ndarray,))


def test_one_launch_to_two_trips_then_two_levels():
    """The launchers' split (level_one_blocks): one block up to two trips of its threads (65536
    floats, 32768 doubles), then a first level of a block per slice."""
    f32, f64 = (CosineEmbeddingLossReduce.for_dtype(d) for d in ("f32", "f64"))
    assert [f32.level_one_blocks(n) for n in (1, 65536, 65537, 1 << 20, 2**31 - 1)] == \
        [0, 0, 3, 32, 65536]
    assert [f64.level_one_blocks(n) for n in (32768, 32769, 65536)] == [0, 3, 4]
    assert CosineEmbeddingLossReduce.for_dtype("bf16").level_one_blocks(65537) == 3


def test_the_models_bits_pin_the_order():
    """Matching the model bit for bit says something only if another order gives other bits:
    the same losses one thread over (rolled by one row) do, and a float32 sum row after row."""
    for n in (40000, 65536):
        loss = losses(n, "f32", seed=5)
        got = model(loss, 1.0, "f32")
        assert got != model(np.roll(loss, 1), 1.0, "f32")
        assert got != np.add.accumulate(loss, dtype=np.float32)[-1]


# -- the emulator ------------------------------------------------------------------------------

emulator = pytest.mark.emulator

# Every N to 64, then a sample to a few thousand; the 128-bit trips are 8 chunks of 1024 threads
# (32768 floats, 16384 doubles): N at and around one and two of them.
SWEEP = [*range(65), 95, 127, 128, 129, 255, 1023, 1024, 1025, 1031, 2047, 3001, 4095, 4096,
         4097, 4099, 5000, 16383, 16384, 16385, 32767, 32768, 32769, 65536]


def run(loss, n, scale, dtype, schedule="forward"):
    """One launch, one block: the reduced value."""
    from cek import emulate

    kernel = CosineEmbeddingLossReduce.for_dtype(dtype)
    reduced = dtypes.nan_filled((), dtype)
    emulate.load(kernel, schedule=schedule)(*kernel.launch_config(n)[:2],
                                            (loss, reduced, n, scale, None))
    return reduced


def run_two_levels(loss, n, scale, dtype, schedule="forward"):
    """(partials, reduced): the first level into a NaN-filled workspace, a block per slice,
    then one block over the partials, as the launchers run them above the split."""
    from cek import emulate

    kernel = CosineEmbeddingLossReduce.for_dtype(dtype)
    launch = emulate.load(kernel, schedule=schedule)
    blocks = kernel.blocks(n)
    partials = np.full(blocks, np.nan, dtypes.get(dtype).acc)
    reduced = dtypes.nan_filled((), dtype)
    launch(*kernel.launch_config(n, None, True)[:2], (loss, reduced, n, scale, partials))
    assert np.isnan(dtypes.to_float64(reduced, dtype))  # the first level writes no result
    launch(*kernel.launch_config(blocks)[:2], (partials, reduced, blocks, scale, None))
    return partials, reduced


@emulator
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_n_gives_the_models_bits_and_the_float64_result(dtype):
    for n in SWEEP:
        loss = losses(n, dtype, seed=n)
        for reduction in ("mean", "sum") if n else ("sum",):
            got = run(loss, n, scale_of(n, reduction), dtype)
            expect = model(loss, scale_of(n, reduction), dtype)
            assert got.tobytes() == expect.tobytes(), (n, reduction, got, expect)
            if n:
                value, size = want(loss, reduction)
                _, _, failures = check.compare({"reduced": got}, {"reduced": np.asarray(value)},
                                               {"reduced": np.asarray(size)}, dtype)
                assert not failures, (n, reduction, failures)
            else:  # no rows: the sum is 0, written over the NaN the output held
                assert dtypes.to_float64(got, dtype) == 0.0


@emulator
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("n", [1, 7, 4097, 32769])
def test_a_misaligned_loss_is_added_in_the_same_order(dtype, n):
    """A view one element into its buffer takes the element-by-element loads: the same chunks,
    the same order, the same bits."""
    loss = losses(n, dtype, seed=2)
    view = np.empty(n + 1, loss.dtype)[1:]
    view[...] = loss
    assert view.ctypes.data % 16
    assert run(view, n, 1.0, dtype).tobytes() == run(loss, n, 1.0, dtype).tobytes() == \
        model(loss, 1.0, dtype).tobytes()


@emulator
def test_the_same_bits_under_every_schedule():
    loss = losses(40000, "f32", seed=3)
    bits = {run(loss, 40000, 1 / 40000, "f32", schedule).tobytes()
            for schedule in ("forward", "reverse", "random:1", "random:2")}
    assert bits == {model(loss, 1 / 40000, "f32").tobytes()}


@emulator
def test_a_nan_loss_makes_the_result_nan():
    loss = losses(3000, "f32")
    loss[1234] = np.nan
    assert np.isnan(run(loss, 3000, 1.0, "f32"))


@emulator
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_65536_rows(dtype):
    loss = losses(65536, dtype, seed=7)
    for reduction in ("mean", "sum"):
        got = run(loss, 65536, scale_of(65536, reduction), dtype, schedule="random:4")
        assert got.tobytes() == model(loss, scale_of(65536, reduction), dtype).tobytes()
        value, size = want(loss, reduction)
        assert not check.compare({"reduced": got}, {"reduced": np.asarray(value)},
                                 {"reduced": np.asarray(size)}, dtype)[2]


# -- two levels: a block per slice into the partials, then one block over them -----------------


def two_level_sizes(dtype):
    """N around one slice, at and past the split (two slices), several slices and a tail that
    is no whole chunk."""
    step = slice_rows(dtype)
    return [1, 7, step - 1, step, step + 1, 2 * step, 2 * step + 1, 2 * step + 3,
            3 * step + 4097, 5 * step - 1]


def assert_two_levels(loss, n, dtype, schedule="forward"):
    for reduction in ("mean", "sum"):
        scale = scale_of(n, reduction)
        partials, got = run_two_levels(loss, n, scale, dtype, schedule)
        assert partials.tobytes() == partials_model(loss, dtype).tobytes(), (n, reduction)
        assert got.tobytes() == two_level_model(loss, scale, dtype).tobytes(), (n, reduction)
        value, size = want(loss, reduction)
        if value > float(np.finfo(np.float16).max) and dtype == "f16":
            assert dtypes.to_float64(got, dtype) == np.inf  # a float16 sum past its range
            continue
        _, _, failures = check.compare({"reduced": got}, {"reduced": np.asarray(value)},
                                       {"reduced": np.asarray(size)}, dtype)
        assert not failures, (n, reduction, failures)


@emulator
@pytest.mark.parametrize("dtype", DTYPES)
def test_two_levels_give_the_models_bits_and_the_float64_result(dtype):
    for n in two_level_sizes(dtype):
        assert_two_levels(losses(n, dtype, seed=n), n, dtype)


@emulator
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_a_million_rows_in_two_levels(dtype):
    """1M x 128's reduction: 32 float slices (64 double ones), then one block over them."""
    n = 1 << 20
    assert CosineEmbeddingLossReduce.for_dtype(dtype).level_one_blocks(n) == \
        n // slice_rows(dtype)
    assert_two_levels(losses(n, dtype, seed=9), n, dtype, schedule="random:5")


def test_the_two_level_models_bits_pin_the_order():
    """Two levels add in another order than one block over the same losses: their bits
    differ here (the top of both trees rounds most small differences away: at 65537 floats
    they agree), so matching two_level_model says which order the kernels took."""
    for n in (3 * 32768 + 5, 1 << 20):
        loss = losses(n, "f32", seed=5)
        assert two_level_model(loss, 1.0, "f32") != model(loss, 1.0, "f32")


@emulator
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("slices", [1, 3])
def test_a_misaligned_loss_is_added_in_the_same_order_in_two_levels(dtype, slices):
    """Each slice of a view one element into its buffer is misaligned alike: element-by-element
    loads, the same chunks in the same order, the same partials and bits."""
    n = slices * slice_rows(dtype) + 5
    loss = losses(n, dtype, seed=4)
    view = np.empty(n + 1, loss.dtype)[1:]
    view[...] = loss
    assert view.ctypes.data % 16
    got, aligned = run_two_levels(view, n, 0.5, dtype), run_two_levels(loss, n, 0.5, dtype)
    assert got[0].tobytes() == aligned[0].tobytes() == partials_model(loss, dtype).tobytes()
    assert got[1].tobytes() == aligned[1].tobytes() == \
        two_level_model(loss, 0.5, dtype).tobytes()


@emulator
def test_two_levels_give_the_same_bits_under_every_schedule():
    n = 4 * 32768 + 3
    loss = losses(n, "f32", seed=3)
    bits = {run_two_levels(loss, n, 1 / n, "f32", schedule)[1].tobytes()
            for schedule in ("forward", "reverse", "random:1", "random:2")}
    assert bits == {two_level_model(loss, 1 / n, "f32").tobytes()}


@emulator
def test_a_nan_loss_in_one_slice_makes_the_two_level_result_nan():
    n = 3 * 32768 + 1
    loss = losses(n, "f32")
    loss[40000] = np.nan  # slice 1
    partials, got = run_two_levels(loss, n, 1.0, "f32")
    assert list(np.isnan(partials)) == [False, True, False, False] and np.isnan(got)


@emulator
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_traffic_of_two_levels_is_each_loss_and_partial_read_once(dtype):
    """The first level reads each loss once and writes each partial once; the second reads the
    partials once and writes the result once: bytes_moved, the launchers' two launches."""
    from cek import emulate

    kernel = CosineEmbeddingLossReduce.for_dtype(dtype)
    n = 2 * slice_rows(dtype) + 7  # just past the split: three slices, the last of 7 losses
    loss, reduced = losses(n, dtype), dtypes.nan_filled((), dtype)
    partials = np.full(kernel.level_one_blocks(n), np.nan, loss.dtype)
    first = emulate.traffic(kernel, *kernel.launch_config(n, None, True)[:2],
                            (loss, reduced, n, 1.0, partials))
    assert (first["loss"].read, first["loss"].reads, first["loss"].written) == \
        (loss.nbytes, (1, 1), 0)
    assert (first["partials"].written, first["partials"].writes, first["partials"].read) == \
        (partials.nbytes, (1, 1), 0)
    assert (first["reduced"].read, first["reduced"].written) == (0, 0)
    second = emulate.traffic(kernel, *kernel.launch_config(len(partials))[:2],
                             (partials, reduced, len(partials), 1.0, None))
    assert (second["loss"].read, second["loss"].reads) == (partials.nbytes, (1, 1))
    assert (second["reduced"].written, second["reduced"].writes) == (reduced.nbytes, (1, 1))
    assert loss.nbytes + 2 * partials.nbytes + reduced.nbytes == kernel.bytes_moved(n)


@emulator
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_traffic_is_each_loss_read_once_and_the_result_written_once(dtype):
    from cek import emulate

    kernel = CosineEmbeddingLossReduce.for_dtype(dtype)
    for n in (5, 30000):  # a scalar tail; whole trips, one launch in float and double
        loss, reduced = losses(n, dtype), dtypes.nan_filled((), dtype)
        counts = emulate.traffic(kernel, *kernel.launch_config(n)[:2],
                                 (loss, reduced, n, 1.0, None))
        assert (counts["loss"].read, counts["loss"].reads, counts["loss"].written) == \
            (loss.nbytes, (1, 1), 0)
        assert (counts["reduced"].written, counts["reduced"].writes, counts["reduced"].read) == \
            (reduced.nbytes, (1, 1), 0)
        assert loss.nbytes + reduced.nbytes == kernel.bytes_moved(n)


# -- the mean and the sum of a loss: a row kernel, then the reduction --------------------------

# 33: row groups (16 rows a float block: 37 rows leave the last block part full), 769: one block
# per row, 16385: streamed.
CASES = [(37, 33), (7, 769), (1, 33), (1, 769), (3, 16385), (3000, 40)]


def mean_or_sum(cls, inputs, reduction, margin=0.25, schedule="forward"):
    """(per-row losses, reduced) from `cls` and then the reduction, on the emulator."""
    from cek import emulate

    kernel = cls.for_n_dim(inputs["x1"].shape[1], inputs["dtype"])
    n = inputs["x1"].shape[0]
    args, outputs = check.build_args(kernel, inputs, margin)
    emulate.load(kernel, schedule=schedule)(*kernel.launch_config(n, inputs["x1"].shape[1])[:2],
                                            args)
    rows = outputs["loss" if kernel.kind == "fused" else "out"]
    return rows, run(rows, n, scale_of(n, reduction), inputs["dtype"], schedule)


@emulator
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_rows, n_dim", CASES, ids=[f"{n}x{d}" for n, d in CASES])
@pytest.mark.parametrize("cls", [CosineEmbeddingLossFused, CosineEmbeddingLossForwardRows],
                         ids=lambda c: c.short_name)
def test_a_mean_or_sum_is_the_float64_one(cls, n_rows, n_dim, dtype, reduction):
    if n_dim == 16385 and dtype not in ("f32", "bf16"):
        pytest.skip("the streamed path is covered in float and bfloat16")
    inputs = dict(check.make_inputs(n_rows, n_dim, dtype=dtype), dy=None, reduction=reduction)
    inputs["scale"] = scale_of(n_rows, reduction)
    bits = set()
    for schedule in ("forward", "random:1"):
        rows, reduced = mean_or_sum(cls, inputs, reduction, schedule=schedule)
        value = check.expected_reduced(inputs, 0.25)
        size = 1.0 if reduction == "mean" else float(n_rows)
        _, _, failures = check.compare({"reduced": reduced}, {"reduced": np.asarray(value)},
                                       {"reduced": np.asarray(size)}, dtype)
        assert not failures, (schedule, failures)
        bits.add(reduced.tobytes())
    assert len(bits) == 1


@emulator
def test_a_nan_row_makes_the_mean_nan():
    inputs = dict(check.make_inputs(19, 769), dy=None, reduction="sum")
    inputs["x2"][5, 3] = np.nan  # row 5: label -1 (LABELS cycle), a NaN loss
    assert inputs["y"][5] == -1.0
    _, reduced = mean_or_sum(CosineEmbeddingLossFused, inputs, "sum")
    assert np.isnan(reduced)


@emulator
def test_bfloat16_mean_is_rounded_once_from_float():
    """The bfloat16 mean is the float32 total times 1/N, rounded once: within one bfloat16 step
    of the float64 mean."""
    inputs = dict(check.make_inputs(9, 769, dtype="bf16"), dy=None, reduction="mean")
    _, reduced = mean_or_sum(CosineEmbeddingLossFused, inputs, "mean")
    got = float(dtypes.to_float64(reduced, "bf16"))
    value = check.expected_reduced(inputs, 0.25)
    assert abs(got - value) <= abs(value) * 2.0**-8


# -- gpu tier: at scale, through the functional API --------------------------------------------


@pytest.mark.parametrize("where", [
    pytest.param("stand-in", marks=emulator),
    pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_mean_and_a_sum_at_scale_are_the_same_bits_launch_after_launch(monkeypatch, where,
                                                                         dtype):
    """cek.cosine_embedding_loss_fused's mean and sum of 65536 x 768 on a GPU (on the stand-in
    for CuPy, 96 x 40), 20 launches each: the same bits every time, the bits of `model` on the
    per-row losses the fused kernel wrote (the order is the code's, not the GPU's), and within
    tolerance of the float64 reference."""
    import fake_cupy

    from cek import functional as F, gpu

    cupy = fake_cupy.install(monkeypatch).cupy if where == "stand-in" else gpu.require_cupy()
    n, d = (65536, 768) if where == "gpu" else (96, 40)
    inputs = check.make_inputs(n, d, seed=11, dtype=dtype)
    c1, c2, cy = (cupy.asarray(inputs[k]) for k in ("x1", "x2", "y"))
    bf16 = {"dtype": "bfloat16"} if dtype == "bf16" else {}
    for reduction in ("mean", "sum"):
        results = [F.cosine_embedding_loss_fused(c1, c2, cy, 0.25, reduction, **bf16)[0]
                   for _ in range(20)]
        bits = {np.asarray(cupy.asnumpy(r)).tobytes() for r in results}
        assert len(bits) == 1, f"{len(bits)} different results in 20 launches"
        rows, _, _ = F.gpu_rows(c1, c2, cy, None, scale_of(n, reduction), 0.25, dtype=dtype,
                                want_loss=True, want_grads=True)  # the per-row losses, in float
        got = np.asarray(cupy.asnumpy(results[0]))
        value = check.expected_reduced(dict(inputs, reduction=reduction), 0.25)
        size = 1.0 if reduction == "mean" else float(n)
        assert not check.compare({"reduced": got}, {"reduced": np.asarray(value)},
                                 {"reduced": np.asarray(size)}, dtype)[2]
        assert bits == {model(cupy.asnumpy(rows), scale_of(n, reduction), dtype).tobytes()}


# -- compile tier: the loads in flight, read from the SASS ---------------------------------------


@pytest.mark.compile
@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16"])
def test_a_trip_issues_eight_128_bit_loads_before_its_first_add(dtype):
    """The header's claim, on sm_90: the aligned loop's eight chunk loads are all issued before
    the first add waits for one (128 bytes a thread in flight)."""
    from cek import sass

    if sass.find_nvdisasm() is None:
        pytest.skip(sass.MISSING)
    kernel = CosineEmbeddingLossReduce.for_dtype(dtype)
    code = sass.ordinary_path(sass.parse(sass.disassemble(compile_kernel(kernel, "sm_90").cubin)))
    ops = [i.opcode for block in code for i in block]
    wide = [i for i, op in enumerate(ops) if op.startswith("LDG") and ".128" in op]
    first_add = next(i for i in range(wide[0], len(ops)) if ops[i].startswith(("FADD", "DADD")))
    assert len(wide) == 8 and wide[-1] < first_add, ops[wide[0]:first_add + 1]
