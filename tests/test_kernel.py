"""cpu tier: the Kernel fields, ids, sources, entry points, launch configs and argument checks."""

import hashlib
import inspect
import re

import numpy as np
import pytest

import cek
from cek.kernel import RowGroups, kernel_classes, next_power_of_two

from cek.cosine_embedding_loss_split import SplitRows

# The kernels with an instance per BLOCK_SIZE; the split's have one per dtype
# (tests/test_cosine_embedding_loss_split.py).
ALL = [cls for cls in kernel_classes().values() if not issubclass(cls, SplitRows)]
ROW_GROUPS = [cls for cls in ALL if issubclass(cls, RowGroups)]


def test_documented_fields_of_backward():
    k = cek.CosineEmbeddingLossBackward(1024)
    assert k.name == "cosine_embedding_loss_backward"
    assert k.id == "cosine_embedding_loss_backward__f32__1024"
    assert k.block_size == 1024
    assert k.entry_point_name() == "cosine_embedding_loss_backward_entry_point"
    assert k.source == k.kernel_source + "\n\n" + k.entry_point_source
    assert k.cache_key() == hashlib.sha256(k.source.encode()).hexdigest()
    # the documented launch tuple: (*mut f32 x 6, i32, i32, f32)
    assert [k.c_type(a) for a in k.args] == ["float*"] * 6 + ["int", "int", "float"]
    assert [a.name for a in k.args] == ["dy", "x1", "x2", "y", "dx1", "dx2", "n_rows", "n_dim",
                                        "margin"]
    assert "cosine_embedding_loss_backward<1024>(dy, x1, x2, y, dx1, dx2, n_rows, n_dim, margin)" \
        in k.entry_point_source


@pytest.mark.parametrize("dtype, element, acc", [("f64", "double", "double"),
                                                 ("f16", "cek_f16", "float"),
                                                 ("bf16", "cek_bf16", "float")])
def test_other_dtypes_carry_their_types_into_id_and_entry_point(dtype, element, acc):
    k = cek.CosineEmbeddingLossBackward(1024, dtype)
    assert k.id == f"cosine_embedding_loss_backward__{dtype}__1024"
    # dy in the element type (torch's gradient of a loss of that type), labels in the
    # accumulator's
    assert [k.c_type(a) for a in k.args] == [f"{element}*", f"{element}*", f"{element}*",
                                             f"{acc}*", f"{element}*", f"{element}*", "int",
                                             "int", acc]
    assert f"cosine_embedding_loss_backward<1024, {element}>(dy, x1, x2" in k.entry_point_source
    assert k.kernel_source == cek.CosineEmbeddingLossBackward(1024).kernel_source
    assert k.cache_key() != cek.CosineEmbeddingLossBackward(1024).cache_key()


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype must be one of f32, f64, f16, bf16, got 'f8'"):
        cek.CosineEmbeddingLossBackward(1024, "f8")


def test_forward_and_fused_names_and_ids():
    assert cek.CosineEmbeddingLossForward(32).id == "cosine_embedding_loss_forward__f32__32"
    assert cek.CosineEmbeddingLossFused(4096).id == "cosine_embedding_loss_fused__f32__4096"
    assert [a.name for a in cek.CosineEmbeddingLossForward.args] == [
        "x1", "x2", "y", "out", "n_rows", "n_dim", "margin"]


@pytest.mark.parametrize("cls", ALL)
def test_entry_point_instantiates_block_size_with_the_args_in_order(cls):
    k = cls(256)
    params = ", ".join(f"{k.c_type(a)} {a.name}" for a in cls.args)
    # blocks an SM: min_blocks from sm_80 to sm_90; other archs' where a class asks for them
    bounds = k._min_blocks_expression()
    assert _evaluate_arch_expression(bounds, 800) == _evaluate_arch_expression(bounds, 900) \
        == k.min_blocks
    assert f'extern "C" __global__ void __launch_bounds__({k.max_threads}, {bounds}) ' \
           f'{k.entry_point_name()}({params})' in k.entry_point_source
    # row groups: 256 threads; one block per row: a 256-float row takes 64 threads
    assert k.max_threads == (256 if cls in ROW_GROUPS else 64)
    # 2048 threads (a full SM) of 64; a 256-float row group holds two chunk pairs a lane: 6
    # blocks (75%, 40 registers) where it writes gradients, 8 (32 registers) in the forward,
    # which ptxas fits without spilling
    assert k.min_blocks == (32 if cls not in ROW_GROUPS else 8 if cls.kind == "forward" else 6)
    # bfloat16 row groups of 256 threads: 8 blocks, or 6 (75%) where gradients are converted,
    # 4 (half) in the keep kernel, whose loop beside them spilled at 6
    bf16 = 32 if cls not in ROW_GROUPS else 8 if cls.kind == "forward" else \
        4 if cls is cek.CosineEmbeddingLossBackwardKeep else 6
    assert cls(256, "bf16").min_blocks == bf16
    call = f"{cls.name}<256>({', '.join(a.name for a in cls.args)});"
    assert call in k.entry_point_source


@pytest.mark.parametrize("cls", ALL)
def test_kernel_source_is_the_template_with_headers_inlined(cls):
    src = cls(64).kernel_source
    assert f"template <int BLOCK_SIZE, typename T = float>\n__device__ void {cls.name}(" in src
    assert '#include "' not in src  # inlined, so the hash covers the header
    assert re.search(r'#line 1 ".*kernels/cek_row.cuh"', src)
    assert re.search(r'#line 1 ".*kernels/cek_types.cuh"', src)
    source_file = cls.source_file or f"{cls.name}.cu"  # a *_rows variant lives in its twin's
    assert re.search(rf'#line \d+ ".*kernels/{source_file}"', src)
    assert "entry_point" not in src
    # BLOCK_SIZE is only a template argument: the same template text at every size.
    assert cls(64).kernel_source == cls(16384).kernel_source


def test_cache_key_changes_with_block_size_and_kernel():
    keys = {cls(b).cache_key() for cls in ALL for b in (1, 2, 1024)}
    assert len(keys) == 3 * len(ALL)


@pytest.mark.parametrize("bad", [0, -4, 3, 768, 1 << 21])
def test_block_size_outside_the_range_names_it(bad):
    with pytest.raises(ValueError, match=rf"power of two in \[1, 1048576\], got {bad}"):
        cek.CosineEmbeddingLossBackward(bad)


@pytest.mark.parametrize("bad", [2.0, "1024", True, None])
def test_block_size_must_be_an_int(bad):
    with pytest.raises(TypeError):
        cek.CosineEmbeddingLossBackward(bad)


def test_block_sizes_cover_1_to_2_to_the_20():
    assert cek.CosineEmbeddingLossBackward.block_sizes() == [2**i for i in range(21)]


@pytest.mark.parametrize("n, want", [(1, 1), (2, 2), (3, 4), (31, 32), (32, 32), (33, 64),
                                     (768, 1024), (769, 1024), (1024, 1024), (4097, 8192)])
def test_next_power_of_two(n, want):
    assert next_power_of_two(n) == want
    assert cek.CosineEmbeddingLossBackward.for_n_dim(n).block_size == want


# Float rows of 513 and more take two chunk pairs a thread (at most 512 threads a block up to
# 4096, four blocks an SM); up to 512, one.
@pytest.mark.parametrize("n_dim, threads", [(1, 32), (33, 32), (128, 32), (129, 64), (512, 128),
                                            (513, 96), (768, 96), (769, 128), (1000, 128),
                                            (1024, 128), (1025, 160), (2048, 256), (2049, 288),
                                            (3072, 384), (4096, 512), (4097, 544),
                                            (16384, 1024)])
@pytest.mark.parametrize("cls", [cek.CosineEmbeddingLossBackward, cek.CosineEmbeddingLossForward])
def test_threads_cover_the_row_with_whole_warps(cls, n_dim, threads):
    k = cls.for_n_dim(n_dim)
    grid, block, smem = k.launch_config(5, n_dim)
    assert grid == (5, 1, 1) and block == (threads, 1, 1) and smem == 0
    per_thread = 4 * k.chunks_per_thread
    assert threads % 32 == 0 and threads <= 1024
    assert threads * per_thread >= n_dim > (threads - 32) * per_thread


# Blocks of 704 or 736 threads fit two an SM: float rows of 5377..5888 (BLOCK_SIZE 8192) run
# 672, three an SM, each thread holding one element past its chunks. 16-bit rows there hold two
# chunk pairs a thread, at most 512 threads, and need no tail.
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64"])
def test_no_block_of_673_to_767_threads_where_a_tail_can_take_the_rest(dtype):
    for n_dim in range(4097, 8193):
        k = cek.CosineEmbeddingLossFused.for_n_dim(n_dim, dtype)
        threads = k.launch_config(3, n_dim)[1][0]
        in_chunks = threads * k.chunks_per_thread * k.vec
        if dtype != "f32":  # not tailed: the plain rule
            assert not k.tailed and in_chunks >= n_dim > in_chunks - 32 * k.chunks_held * k.vec
            assert dtype == "f64" or (k.chunks_per_thread == 2 and threads <= 512), n_dim
            continue
        assert k.tailed and not 672 < threads < 768, (n_dim, threads)
        # every element is held: in a thread's chunks or, one a thread, past them
        assert in_chunks + (threads if threads == 672 else 0) >= n_dim > in_chunks - 32 * 8, n_dim
        assert (n_dim > in_chunks) == (5377 <= n_dim <= 5888), n_dim


# 16-bit rows of 1025 and more (256 chunks, BLOCK_SIZE >= 2048) take two chunk pairs a thread
# too; up to 1024, one (a 768-wide row at two would run 48 threads, a warp and a half).
@pytest.mark.parametrize("n_dim, threads", [(257, 64), (768, 96), (1024, 128), (1025, 96),
                                            (1536, 96), (2048, 128), (2049, 160), (4096, 256),
                                            (5377, 352), (5888, 384), (8192, 512),
                                            (8193, 544), (16384, 1024)])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("cls", [cek.CosineEmbeddingLossBackward, cek.CosineEmbeddingLossFused])
def test_16_bit_rows_from_1025_hold_two_chunk_pairs(cls, dtype, n_dim, threads):
    k = cls.for_n_dim(n_dim, dtype)
    if cls is cek.CosineEmbeddingLossFused and 512 < n_dim <= 1024:
        return  # row groups: the next test
    assert k.launch_config(5, n_dim)[1] == (threads, 1, 1)
    assert k.chunks_per_thread == (2 if n_dim > 1024 else 1) and not k.tailed
    assert threads * k.chunks_per_thread * 8 >= n_dim > (threads - 32) * k.chunks_per_thread * 8


# ... but the row-group kernels (fused, forward-rows, backward-rows, keep) run 16-bit rows of
# 513..1024 a warp a row, four chunk pairs a lane, eight rows a block of 256 threads.
@pytest.mark.parametrize("name", ["fused", "forward-rows", "backward-rows", "backward-keep"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("n_dim, grouped", [(512, False), (513, True), (768, True),
                                            (1024, True), (1025, False)])
def test_16_bit_rows_of_513_to_1024_run_a_warp_a_row(name, dtype, n_dim, grouped):
    k = kernel_classes()[name].for_n_dim(n_dim, dtype)
    assert k.grouped == grouped
    if grouped:
        assert k.group == 32 and k.chunks_held == 4 and k.min_blocks == 4
        if name != "backward-keep":  # its grid is a wave of the device's blocks
            assert k.launch_config(17, n_dim)[:2] == ((3, 1, 1), (256, 1, 1))
    assert cek.CosineEmbeddingLossBackward.for_n_dim(n_dim, dtype).launch_config(17, n_dim)[0] \
        == (17, 1, 1)  # the seed's backward keeps one block a row


@pytest.mark.parametrize("n_dim", [16385, 100_000, 1 << 20])
def test_rows_past_16384_are_streamed_by_1024_threads(n_dim):
    k = cek.CosineEmbeddingLossBackward.for_n_dim(n_dim)
    assert k.streamed and k.launch_config(3, n_dim) == ((3, 1, 1), (1024, 1, 1), 0)
    assert k.bytes_moved(3, n_dim) == 24 * 3 * n_dim + 8 * 3  # the second read is counted


@pytest.mark.parametrize("dtype, register_limit, threads_768, bytes_per_element", [
    ("f32", 16384, 96, 4), ("f64", 8192, 384, 8), ("f16", 16384, 96, 2), ("bf16", 16384, 96, 2)])
def test_tiling_follows_the_element_size(dtype, register_limit, threads_768, bytes_per_element):
    cls = cek.CosineEmbeddingLossBackward
    assert not cls.for_n_dim(register_limit, dtype).streamed
    assert cls.for_n_dim(register_limit + 1, dtype).streamed
    assert cls.for_n_dim(768, dtype).launch_config(2, 768)[1] == (threads_768, 1, 1)
    acc = 8 if dtype == "f64" else 4
    # x1, x2 read, dx1, dx2 written; the labels in the accumulator, a dy a row in the element
    assert cls.for_n_dim(768, dtype).bytes_moved(10, 768) == \
        4 * bytes_per_element * 10 * 768 + acc * 10 + bytes_per_element * 10


# Float and 16-bit rows of 2..32 chunks: two chunk pairs a lane, half the chunks in lanes (5
# floats: 2 chunks, 1 lane; 128 floats: 32 chunks, 16 lanes); doubles one pair a lane up to 32.
@pytest.mark.parametrize("n_dim, group, grid, dtype", [
    (1, 1, 1, "f32"), (4, 1, 1, "f32"), (5, 1, 1, "f32"), (32, 4, 1, "f32"), (128, 16, 1, "f32"),
    (129, 32, 1, "f32"), (256, 32, 1, "f32"), (256, 16, 1, "bf16"), (8, 1, 1, "f16"),
    (9, 1, 1, "f16"), (128, 8, 1, "bf16"), (128, 32, 1, "f64"), (64, 32, 1, "f64")])
@pytest.mark.parametrize("cls", ROW_GROUPS, ids=lambda c: c.name)
def test_row_group_kernels_run_row_groups_up_to_64_chunks(cls, n_dim, group, grid, dtype):
    k = cls.for_n_dim(n_dim, dtype)
    assert k.group == group and k.chunks_held == (2 if 2 <= k.row_chunks <= 64 and (
        dtype != "f64" or k.row_chunks == 64) else 1)
    n_rows = 256 // group * grid  # exactly `grid` blocks' worth of rows
    assert k.launch_config(n_rows, n_dim) == ((grid, 1, 1), (256, 1, 1), 0)
    assert k.launch_config(n_rows + 1, n_dim)[0] == (grid + 1, 1, 1)


@pytest.mark.parametrize("cls", ROW_GROUPS, ids=lambda c: c.name)
def test_row_group_kernels_above_256_are_one_block_per_row(cls):
    assert cls.for_n_dim(257).launch_config(9, 257) == ((9, 1, 1), (96, 1, 1), 0)
    # 16-bit rows of 257..512 fit 64 chunks, but one block per row holds them at one chunk pair
    # a thread (a row group's lane would hold two: 56 registers)
    for dtype in ("bf16", "f16"):
        assert cls.for_n_dim(384, dtype).launch_config(9, 384) == ((9, 1, 1), (64, 1, 1), 0)


def test_rows_variants_share_their_twins_template_file_and_arguments():
    for rows, twin in ((cek.CosineEmbeddingLossBackwardRows, cek.CosineEmbeddingLossBackward),
                       (cek.CosineEmbeddingLossForwardRows, cek.CosineEmbeddingLossForward)):
        assert rows.twin is twin
        # backward-rows: the twin's arguments with the upstream gradient read in place, its
        # stride and scale after dy
        names = [a.name for a in twin.args]
        if rows is cek.CosineEmbeddingLossBackwardRows:
            names[1:1] = ["dy_stride", "scale"]
        assert [a.name for a in rows.args] == names
        assert {a.name: a.ctype for a in rows.args}.items() >= {a.name: a.ctype
                                                                for a in twin.args}.items()
        assert rows(64).kernel_source == twin(64).kernel_source
        assert rows(64).id == twin.name + "_rows__f32__64"
        assert rows(64).bytes_moved(10, 64) == twin(64).bytes_moved(10, 64)


@pytest.mark.parametrize("cls", [cek.CosineEmbeddingLossBackward, cek.CosineEmbeddingLossForward])
def test_backward_and_forward_keep_one_block_per_row_for_narrow_rows(cls):
    # Their documented contract, grid [n_rows, 1, 1], holds at every width.
    assert cls.for_n_dim(64).launch_config(300, 64) == ((300, 1, 1), (32, 1, 1), 0)


def test_launch_with_the_wrong_block_size_names_both_numbers():
    k = cek.CosineEmbeddingLossBackward(1024)
    with pytest.raises(ValueError, match=r"n_dim=1025 needs block_size=2048.*block_size=1024"):
        k.launch_config(4, 1025)
    with pytest.raises(ValueError, match="n_rows must be a positive int, got 0"):
        k.launch_config(0, 1000)


def _backward_args(n=3, d=5):
    """Arguments of the backward-rows kernel, cek's backward with the upstream gradient's stride
    and scale (the backward kernel's own are the documented nine: tests/test_seed_contract.py)."""
    f = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    return [f(n), 1, 1.0, f(n, d), f(n, d), f(n), f(n, d), f(n, d), n, d, 0.5]


def test_check_args_casts_scalars_to_their_c_types():
    cast = cek.CosineEmbeddingLossBackwardRows(8).check_args(_backward_args(), (np.ndarray,))
    assert type(cast[1]) is np.int32 and type(cast[8]) is np.int32 and type(cast[9]) is np.int32
    assert type(cast[2]) is np.float32 and type(cast[10]) is np.float32


@pytest.mark.parametrize("margin", [1e39, -1e300, 3.5e38])
def test_a_finite_float_beyond_float32_becomes_its_infinity_without_a_warning(margin):
    """The kernel's float arithmetic would make it so; NumPy's cast warns "overflow encountered
    in cast", an exception under -W error, where cek's own checks must raise nothing."""
    import warnings

    args = _backward_args()
    args[10] = margin
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cast = cek.CosineEmbeddingLossBackwardRows(8).check_args(args, (np.ndarray,))
    assert cast[10] == np.float32(np.inf) * np.sign(margin)


@pytest.mark.parametrize("value", [np.float16(0.5), np.float16(-65504.0), np.float16("nan"),
                                   np.float64(1e39), np.int8(3)])
def test_a_numpy_scalar_of_any_width_casts_without_a_warning(value):
    """A float16 scalar for margin or scale: its range check compared the bound cast to float16
    (an infinity), and NumPy warned "overflow encountered in cast", an error under -W error."""
    import warnings

    args = _backward_args()
    args[2] = args[10] = value  # scale and margin
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cast = cek.CosineEmbeddingLossBackwardRows(8).check_args(args, (np.ndarray,))
    want = np.float32(np.inf) if value == np.float64(1e39) else np.float32(value)
    assert type(cast[2]) is np.float32
    np.testing.assert_array_equal([cast[2], cast[10]], [want, want])


def test_bf16_arrays_are_uint16_bits():
    args = _backward_args()
    for i in (0, 3, 4, 6, 7):  # dy as well: the upstream gradient comes in the element type
        args[i] = np.zeros(args[i].shape, np.uint16)
    kernel = cek.CosineEmbeddingLossBackwardRows(8, "bf16")
    assert kernel.check_args(args, (np.ndarray,))[3].dtype == np.uint16
    args[3] = np.zeros((3, 5), np.float16)
    with pytest.raises(TypeError, match=r"x1 must be uint16 \(bfloat16 bits\), got float16"):
        kernel.check_args(args, (np.ndarray,))


@pytest.mark.parametrize("index, value, error, message", [
    (3, np.zeros((3, 5), np.float64), TypeError, "x1 must be float32, got float64"),
    (4, np.zeros((3, 4), np.float32), ValueError, r"x2 must have shape \(n_rows, n_dim\) = \(3, 5\)"),
    (6, np.zeros((5, 3), np.float32).T, ValueError, "dx1 must be C-contiguous"),
    (0, [0.0, 0.0, 0.0], TypeError, "dy must be a numpy.ndarray, got list"),
    (0, np.zeros(3, np.float64), TypeError, "dy must be float32, got float64"),
    (0, np.zeros(()), TypeError, "dy must be float32"),
    (1, 2, ValueError, "dy_stride must be 0 .* or 1 .*, got 2"),
    (8, 3.0, TypeError, "n_rows must be an int, got float"),
    (9, 2**31, ValueError, "does not fit a 32-bit int"),
    (10, "0.5", TypeError, "margin must be a float, got str"),
])
def test_check_args_refuses_bad_arguments(index, value, error, message):
    args = _backward_args()
    args[index] = value
    with pytest.raises(error, match=message):
        cek.CosineEmbeddingLossBackwardRows(8).check_args(args, (np.ndarray,))


@pytest.mark.parametrize("dy, stride, error", [
    (np.zeros(3, np.float32), 1, None),         # one a row
    (np.zeros((), np.float32), 0, None),        # a mean's 0-d gradient, read for every row
    (np.zeros(1, np.float32), 0, None),
    (None, 0, "dy must be a numpy.ndarray, got NoneType"),  # a backward kernel reads one
    (np.zeros(3, np.float32), 0, "dy must hold one value for dy_stride = 0, got shape"),
    (np.zeros((), np.float32), 1, r"dy must have shape \(n_rows\) = \(3,\), got \(\)"),
    (np.zeros(4, np.float32), 1, r"dy must have shape \(n_rows\) = \(3,\), got \(4,\)"),
])
def test_dy_is_one_a_row_or_one_for_every_row(dy, stride, error):
    args = _backward_args()
    args[0], args[1] = dy, stride
    kernel = cek.CosineEmbeddingLossBackwardRows(8)
    if error is None:
        assert kernel.check_args(args, (np.ndarray,))[1] == stride
    else:
        with pytest.raises((ValueError, TypeError), match=error):
            kernel.check_args(args, (np.ndarray,))


def test_check_args_counts_arguments():
    with pytest.raises(TypeError, match="takes 11 arguments, got 10"):
        cek.CosineEmbeddingLossBackwardRows(8).check_args(_backward_args()[:-1], (np.ndarray,))


def test_only_optional_pointers_take_none():
    fused = cek.CosineEmbeddingLossFused(8)
    n, d = 3, 5
    z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    args = [z(n, d), z(n, d), z(n), None, 0, 1.0, z(n), z(n, d), z(n, d), None, None, n, d, 0.0]
    cast = fused.check_args(args, (np.ndarray,))
    assert cast[3] is None and cast[9] is None and cast[10] is None
    args[2] = None
    with pytest.raises(TypeError, match="y must be a numpy.ndarray, got NoneType"):
        fused.check_args(args, (np.ndarray,))


def test_no_kernel_takes_a_counter_and_only_the_reduction_a_workspace():
    """A mean or sum is a second launch over the per-row losses (CosineEmbeddingLossReduce):
    no kernel keeps state across blocks or launches, so none takes a counter to zero first.
    The workspaces are the reduction's optional partials, for its first level, and the split's
    partial sums, written whole by its first launch and read by its second: each block writes
    its own entry and none reads another's (the next launch does), so no block waits on
    another: their sources have no fence and no atomic. Every other output is written by every
    launch, but the fused kernels' optional ones, written where given."""
    import re

    from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
    from cek.cosine_embedding_loss_split import CosineEmbeddingLossSplitSums

    optional_outputs, derived = set(), set()
    for cls in [*kernel_classes().values(), CosineEmbeddingLossReduce]:
        assert "counter" not in {a.name for a in cls.args}, cls.name
        assert all(a.ctype in ("int", "T*", "A*", "A") or a.derived for a in cls.args), cls.name
        optional_outputs |= {(cls.name, a.name) for a in cls.args if a.output and a.optional}
        derived |= {(cls.name, a.name, a.output) for a in cls.args if a.derived}
    # the fused kernels' outputs but dx1 and dx2 are the launcher's to ask for: the loss in
    # the accumulation type (a reduction's input) or in the inputs' type ("none"), and the
    # labels' copy of cek.torch's training step
    fused = {(name, out) for name in ("cosine_embedding_loss_fused",
                                      "cosine_embedding_loss_split_fused")
             for out in ("loss", "loss_out", "y_out")}
    assert optional_outputs == {("cosine_embedding_loss_reduce", "partials")} | fused
    splits = [cls for cls in kernel_classes().values() if issubclass(cls, SplitRows)]
    assert derived == {(cls.name, "sums", cls is CosineEmbeddingLossSplitSums) for cls in splits}
    for kernel in (CosineEmbeddingLossReduce.for_dtype("f32"),
                   CosineEmbeddingLossSplitSums.for_dtype("f32")):
        assert not re.search(r"\batomic\w*\s*\(|__threadfence", kernel.kernel_source)


def test_a_gpu_launch_without_a_device_is_one_clear_error(monkeypatch):
    from cek import gpu

    monkeypatch.setattr(gpu, "cupy_or_none", object)  # CuPy present (or not installed at all)
    monkeypatch.setattr(gpu, "device_count", lambda: 0)
    with pytest.raises(gpu.NoDeviceError, match="no CUDA device found; `cek check --device cpu`"):
        gpu.launch(cek.CosineEmbeddingLossForward(8), *([None] * 7))
    monkeypatch.setattr(gpu, "cupy_or_none", lambda: None)
    with pytest.raises(gpu.NoDeviceError, match=r"CuPy: pip install cupy-cuda12x.*'\.\[cuda12\]'"):
        gpu.load(cek.CosineEmbeddingLossForward(8))


def test_import_cek_needs_neither_cupy_nor_a_gpu():
    import subprocess
    import sys

    code = ("import sys; sys.modules['cupy'] = None; import cek; "
            "print(cek.gpu.device_count(), cek.CosineEmbeddingLossFused(8).id)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "cosine_embedding_loss_fused__f32__8"]


@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_launched_blocks_fit_the_entry_points_launch_bounds(cls, dtype):
    # A GPU refuses a block larger than __launch_bounds__; the emulator does not check it.
    for block_size in cls.block_sizes():
        k = cls(block_size, dtype)
        for n_dim in {block_size // 2 + 1, block_size}:
            (_, block, _) = k.launch_config(300, n_dim)
            assert block[0] % 32 == 0 and block[0] <= k.max_threads, (k.id, n_dim, block)


def test_registry_lists_every_kernel_once_without_importing_its_subclasses():
    assert list(kernel_classes()) == ["backward", "forward", "fused", "split-sums",
                                      "forward-split", "backward-split", "backward-keep-split",
                                      "fused-split", "backward-rows", "backward-keep",
                                      "forward-rows"]
    assert all(cls.short_name == short for short, cls in kernel_classes().items())
    source = inspect.getsource(cek.kernel)
    assert "import cek.cosine" not in source and "from cek.cosine" not in source


def test_a_second_kernel_with_a_taken_short_name_is_refused():
    with pytest.raises(ValueError, match="two kernel classes named 'fused'"):
        type("Again", (cek.Kernel,), {"short_name": "fused"})


def test_a_misaligned_workspace_of_partial_sums_is_refused():
    """The split's partial sums are read and written 16 bytes at a time (CekSliceSums is
    alignas(16)): a workspace at another address would be a misaligned-address fault on a
    GPU, which loses the process's CUDA context. check_args refuses it, naming the address."""
    from cek.cosine_embedding_loss_split import CosineEmbeddingLossSplitSums, partials_shape

    kernel = CosineEmbeddingLossSplitSums.for_dtype("f32")
    n, d = 2, 5000
    x = np.zeros((n, d), np.float32)
    rows, width = partials_shape(n, d, "f32")
    memory = np.zeros(rows * width + 4, np.float32)
    base = memory.ctypes.data % 16 // 4  # elements to the first 16-byte boundary
    aligned = memory[(4 - base) % 4:][:rows * width].reshape(rows, width)
    assert kernel.check_args((x, x, aligned, n, d), (np.ndarray,))[2] is aligned
    shifted = memory[(4 - base) % 4 + 1:][:rows * width].reshape(rows, width)
    with pytest.raises(ValueError, match=r"sums must start at a multiple of 16 bytes .*0x"):
        kernel.check_args((x, x, shifted, n, d), (np.ndarray,))


def _evaluate_arch_expression(text: str, arch: int) -> int:
    """The value of a `__CUDA_ARCH__ >= A ? x : ...` chain for __CUDA_ARCH__ = arch."""
    for part in text.split(" : "):
        condition, _, value = part.rpartition(" ? ")
        if not condition or arch >= int(condition.removeprefix("__CUDA_ARCH__ >= ")):
            return int(value)
    raise AssertionError(text)


@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_blocks_an_sm_fit_each_arch_or_are_one(cls, dtype):
    # ptxas ignores (with a warning) a blocks-an-SM hint that the arch's SM cannot hold; the
    # entry point asks 1 there, and min_blocks, or a class's own, wherever it fits.
    limits = {750: (1024, 16), 800: (2048, 32), 860: (1536, 16), 870: (1536, 16),
              890: (1536, 24), 900: (2048, 32), 1000: (2048, 32), 1030: (2048, 32),
              1070: (1024, 16), 1100: (1536, 24), 1200: (1536, 24), 1210: (1536, 24)}
    for block_size in cls.block_sizes():
        k = cls(block_size, dtype)
        text = k._min_blocks_expression()
        for arch, (threads, blocks) in limits.items():
            asked = k.min_blocks_from_sm100 if arch >= 1000 else \
                k.min_blocks if arch >= 800 else k.min_blocks_before_sm80
            fits = asked <= blocks and asked * k.max_threads <= threads
            assert _evaluate_arch_expression(text, arch) == (asked if fits else 1), (k.id, arch)
