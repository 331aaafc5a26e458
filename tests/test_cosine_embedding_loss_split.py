"""The split's pairs (cek/cosine_embedding_loss_split.py) on the CPU emulator, against float64.

Each pair runs as the launchers run it: the partial sums, then the kernel of the result reading
them (check.run_case launches kernel.first before the kernel). Outputs are prefilled with NaN
(check.build_args), so a slice a block forgot to write fails; the widths cut rows into one
slice, a whole one, a ragged last one of one element, several, and the 1025 slices of
2^20 + 1 floats; misaligned views take the scalar path. The decision where the launchers split
(`splits`) and the launch contract are here too; the glue's launches are in tests/test_gpu_glue.py
and tests/test_torch_cuda_glue.py, the traffic in tests/test_traffic.py, the static figures in
tests/test_static_targets.py.
"""

import numpy as np
import pytest

from cek import check, dtypes
from cek.compile import compile_kernel
from cek import cosine_embedding_loss_split as split
from cek.kernel import kernel_classes
from oracle import KEPT, reference_on_scaled_copies
from test_cosine_embedding_loss import _huge_rows, _misaligned

SECONDS = ["forward-split", "backward-split", "backward-keep-split", "fused-split"]
PAIRS = [kernel_classes()[name] for name in SECONDS]
SUMS = kernel_classes()["split-sums"]
# float32 slices are 4096 elements: one, one whole, a last slice of one element, five with a
# ragged end, and the widest the one-block kernels take plus one (257 slices).
F32_DIMS = [1, 33, 4096, 4097, 16385, (1 << 20) + 1]
# 2048-element double slices, 8192-element 16-bit ones: several slices each, and a ragged end
OTHER_DIMS = {"f64": [3, 2049, 9000], "f16": [8, 8193, 20000], "bf16": [8, 8193, 20000]}


def _id(value):
    return value.short_name if isinstance(value, type) else None


def _inputs(cls, n_rows, n_dim, seed=0, dtype="f32"):
    inputs = check.make_inputs(n_rows, n_dim, seed, dtype=dtype)
    if cls.kind == "fused":  # the mean's case (no dy) on odd seeds, a scaled dy on even ones
        inputs.update({"dy": None, "scale": 1 / n_rows} if seed % 2 else {"scale": 0.5})
    elif cls.kind == "backward":  # a mean's: one dy for every row on odd seeds
        inputs.update({"dy": inputs["dy"][:1].reshape(()), "dy_stride": 0, "scale": 1 / n_rows}
                      if seed % 2 else {"scale": 0.5})
    return inputs


@pytest.fixture(scope="module")
def emulator():
    pytest.importorskip("cek.emulate")
    return {s: check.emulator_launcher(schedule=s) for s in ("forward", "random:1")}


def _passes(result):
    assert result.passed, result.detail


@pytest.mark.emulator
@pytest.mark.parametrize("n_dim", F32_DIMS)
@pytest.mark.parametrize("cls", [SUMS, *PAIRS], ids=_id)
def test_pairs_match_the_reference(emulator, cls, n_dim):
    """Every result of the pair, and the partial sums themselves, in float32: three rows at
    three margins (one row at 2^20 + 1), then a thread order at random."""
    rows = 1 if n_dim > 100_000 else 3
    for seed, margin in enumerate(check.MARGINS[: 1 if rows == 1 else 3]):
        kernel = cls.for_n_dim(n_dim)
        _passes(check.run_case(kernel, emulator["forward"], "cpu",
                               _inputs(cls, rows, n_dim, seed), margin))
    if rows > 1:
        _passes(check.run_case(kernel, emulator["random:1"], "cpu",
                               _inputs(cls, rows, n_dim, 3), 0.25))


@pytest.mark.emulator
@pytest.mark.parametrize("dtype, n_dim", [(t, d) for t, dims in OTHER_DIMS.items() for d in dims])
@pytest.mark.parametrize("cls", [SUMS, *PAIRS], ids=_id)
def test_pairs_match_the_reference_in_other_dtypes(emulator, cls, dtype, n_dim):
    kernel = cls.for_n_dim(n_dim, dtype)
    _passes(check.run_case(kernel, emulator["random:1"], "cpu",
                           _inputs(cls, 3, n_dim, 1, dtype), -0.5))


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16"])
@pytest.mark.parametrize("cls", [SUMS, *PAIRS], ids=_id)
def test_misaligned_views_take_the_scalar_path(emulator, cls, dtype):
    # a view one element into its buffer: no row is 16-byte aligned, a 128-bit access faults
    n_dim = 2 * split.slice_width(dtype) + 3
    inputs = _misaligned(_inputs(cls, 2, n_dim, dtype=dtype))
    _passes(check.run_case(cls.for_n_dim(n_dim, dtype), emulator["forward"], "cpu", inputs, 0.0))


def _outputs(kernel, launch, inputs, margin=0.25):
    args, outputs = check.build_args(kernel, check.with_first(kernel, launch, inputs, margin),
                                     margin)
    launch(kernel, args)
    return outputs


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_the_bits_are_a_rows_own(emulator, dtype):
    """Every block of a row adds its partials in one tree, the same in each: the forward's
    loss and the fused kernel's are the same bits; a row gives the same bits alone as beside
    others, and under another thread order."""
    n_dim = 3 * split.slice_width(dtype) + 5
    inputs = _inputs(PAIRS[-1], 4, n_dim, seed=2, dtype=dtype)
    fused = split.CosineEmbeddingLossSplitFused.for_n_dim(n_dim, dtype)
    forward = split.CosineEmbeddingLossSplitForward.for_n_dim(n_dim, dtype)
    together = _outputs(fused, emulator["forward"], inputs)
    alone_forward = _outputs(forward, emulator["forward"], inputs)["out"]
    assert together["loss"].tobytes() == alone_forward.tobytes()
    again = _outputs(fused, emulator["random:1"], inputs)
    row = 2
    alone = _outputs(fused, emulator["random:1"],
                     {k: (v[row:row + 1] if isinstance(v, np.ndarray) else v)
                      for k, v in inputs.items()})
    for name in ("loss", "dx1", "dx2"):
        assert together[name].tobytes() == again[name].tobytes(), name
        assert together[name][row:row + 1].tobytes() == alone[name].tobytes(), name


def _slice_rows(dtype):
    """Six rows of four slices (float64 values) that the rescaled branch must get right: a
    slice whose squares overflow (a far slice) among ordinary ones; every slice finite but the
    row's squared norm past 2^64 (2^512 in double); every slice finite and the row's sum past
    the largest value; x2 = -x1 huge; and an ordinary row and a zero one beside them."""
    width = split.slice_width(dtype)
    n_dim = 3 * width + 5
    base = check.make_inputs(6, n_dim, seed=4, zero_row=False, dtype="f32")
    x1, x2 = base["x1"].astype(np.float64), base["x2"].astype(np.float64)
    x1 /= np.abs(x1).max(1, keepdims=True)
    x2 /= np.abs(x2).max(1, keepdims=True)
    top = float(np.finfo(np.float64 if dtype == "f64" else np.float32).max)
    exp = np.frexp(top)[1]  # 128 or 1024
    x1[1, width:2 * width] *= 2.0 ** (exp // 2 + 8)  # its squares overflow: a far slice
    x2[1, :width] *= 2.0 ** (exp // 4)  # huge, but finite squares
    x1[2] *= 2.0 ** (exp // 4 + 8)  # each slice's sum past 2^64 (2^512), finite: MID
    # every element 1.25 * 2^k: a slice's squares add up to 0.39 (0.78 in double) of the top,
    # the row's three and a bit past it
    k = int(np.ceil((exp - np.log2(width)) / 2)) - 1
    x1[3] = np.sign(x1[3] + 1e-9) * 1.25 * 2.0**k
    x2[3] = x1[3] * 0.5
    x1[4] *= 2.0 ** (exp // 2 + 4)
    x2[4] = -x1[4]
    x1[5] = 0.0
    return x1, x2, base


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16"])
@pytest.mark.parametrize("cls", PAIRS, ids=_id)
def test_huge_rows_stay_right_when_split(emulator, cls, dtype):
    """Rows whose squared norms overflow the accumulation type, in part or whole, and those of
    the one-block kernels' own test (tests/test_cosine_embedding_loss.py) cut into slices: c, the
    loss and the gradients of the unscaled rows, as the float64 reference gives them on copies
    scaled by powers of two. bfloat16 shares float32's range, so its rows are float32's."""
    width = split.slice_width(dtype)
    for x1, x2, base in (_slice_rows(dtype), _huge_rows(2 * width + 7, dtype)):
        acc = dtypes.get(dtype).acc
        n = len(x1)
        inputs = {"x1": dtypes.from_float(x1, dtype), "x2": dtypes.from_float(x2, dtype),
                  "y": np.array([1, -1] * (n // 2), acc),
                  "dy": dtypes.from_float(base["dy"][:n], dtype), "scale": 0.5, "dtype": dtype}
        x1, x2 = dtypes.to_float64(inputs["x1"], dtype), dtypes.to_float64(inputs["x2"], dtype)
        assert np.isfinite(x1).all() and np.isfinite(x2).all()
        kernel = cls.for_n_dim(x1.shape[1], dtype)
        outputs = _outputs(kernel, emulator["random:1"], inputs, -0.5)
        dy = check.upstream(inputs, n)  # scale * dy, in every gradient kernel
        loss, dx1, dx2, m1, m2 = reference_on_scaled_copies(x1, x2, inputs["y"], dy, -0.5)
        if kernel.kind != "forward":
            rtol, atol = check.TOLERANCES[dtype, "grad"]
            for name, want, size in (("dx1", dx1, m1), ("dx2", dx2, m2)):
                got = dtypes.to_float64(outputs[name], dtype)
                bad = ~(np.abs(got - want) <= atol * size + rtol * np.abs(want) + KEPT[dtype])
                assert not bad.any(), (name, np.argwhere(bad)[:3].tolist(), got[bad][:3],
                                       want[bad][:3])
        got_loss = outputs.get("out", outputs.get("loss"))
        if got_loss is not None:
            rtol, atol = check.TOLERANCES[dtype, "loss"]
            np.testing.assert_allclose(got_loss, loss, rtol=rtol, atol=atol)


@pytest.mark.emulator
@pytest.mark.parametrize("sanitize", ["thread", "address"])
@pytest.mark.parametrize("cls", [split.CosineEmbeddingLossSplitForward,
                                 split.CosineEmbeddingLossSplitFused], ids=_id)
def test_sanitizers_find_nothing_in_the_pairs(cls, sanitize):
    """Ordinary rows of two slices, and the huge rows, whose branches add the partials a
    second time in each kernel (a barrier between the two uses of the shared partials: without
    it ThreadSanitizer names the race)."""
    pytest.importorskip("cek.emulate")
    launch = check.emulator_launcher(sanitize=sanitize)
    _passes(check.run_case(cls.for_dtype(), launch, "cpu", _inputs(cls, 2, 4097, 1), 0.0))
    x1, x2, base = _slice_rows("f32")
    inputs = {"x1": x1.astype(np.float32), "x2": x2.astype(np.float32),
              "y": np.array([1, -1] * 3, np.float32), "dy": base["dy"][:6], "scale": 0.5}
    outputs = _outputs(cls.for_dtype(), launch, inputs, 0.0)
    assert np.isfinite(outputs.get("loss", outputs.get("out"))).all()


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_nan_in_one_slice_reaches_its_rows_loss_and_every_slice_of_its_gradient(emulator, dtype):
    cls = split.CosineEmbeddingLossSplitFused
    n_dim = 3 * split.slice_width(dtype)
    inputs = _inputs(cls, 4, n_dim, dtype=dtype)
    inputs["y"][:] = [1, -1, 0, 1]
    inputs["x1"][:3, split.slice_width(dtype) + 5] = dtypes.from_float(np.float32(np.nan), dtype)
    outputs = _outputs(cls.for_dtype(dtype), emulator["forward"], inputs, 0.0)
    assert np.isnan(outputs["loss"][:2]).all() and outputs["loss"][2] == 0  # torch: label 0 -> 0
    for name in ("dx1", "dx2"):
        values = dtypes.to_float64(outputs[name], dtype)
        assert np.isnan(values[:3]).all() and np.isfinite(values[3]).all()


@pytest.mark.emulator
def test_a_huge_row_of_2_to_the_20_plus_1_alone(emulator):
    """N = 1, 257 slices, one of them far, the row's sum past float32's top: the rescaled
    branch on the widest row the emulator tier runs."""
    n_dim = (1 << 20) + 1
    x1, x2 = (check.make_inputs(1, n_dim, seed=s)["x1"].astype(np.float64) for s in (5, 6))
    x1[0, 70_000:74_096] *= 2.0**72  # a far slice of x1
    x2 *= 2.0**40  # every slice of x2 finite, the row past 2^64
    inputs = {"x1": x1.astype(np.float32), "x2": x2.astype(np.float32),
              "y": np.ones(1, np.float32), "dy": np.ones(1, np.float32), "scale": 1.0}
    outputs = _outputs(split.CosineEmbeddingLossSplitFused.for_n_dim(n_dim), emulator["forward"],
                       inputs, 0.0)
    loss, dx1, dx2, m1, m2 = reference_on_scaled_copies(
        inputs["x1"].astype(np.float64), inputs["x2"].astype(np.float64), inputs["y"],
        np.ones(1), 0.0)
    np.testing.assert_allclose(outputs["loss"], loss, rtol=1e-4, atol=1e-5)
    for got, want, size in ((outputs["dx1"], dx1, m1), (outputs["dx2"], dx2, m2)):
        assert np.all(np.abs(got - want) <= 1e-5 * size + 1e-4 * np.abs(want) + KEPT["f32"])


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("grid", [None, 1, 4])
def test_the_keep_kernel_leaves_kept_rows_and_recomputes_the_others(emulator, dtype, grid):
    """A row whose dy is 1 is left as it is (a sentinel survives) in every slice; the others
    get the backward's gradients, from the partials the fused forward left, on a grid of any
    size (a block a slice, or a few taking every G-th slice of the reverse walk)."""
    n, n_dim = 5, 2 * split.slice_width(dtype) + 9
    kernel = split.CosineEmbeddingLossSplitBackwardKeep.for_n_dim(n_dim, dtype)
    inputs = check.make_inputs(n, n_dim, seed=7, dtype=dtype)
    kept = np.arange(n) % 2 == 1
    inputs["dy"][kept] = dtypes.from_float(np.float32(1.0), dtype)
    inputs["scale"] = 0.2
    launch = emulator["random:1"]
    args, outputs = check.build_args(kernel, check.with_first(kernel, launch, inputs, 0.1), 0.1)
    sentinel = dtypes.from_float(np.full((n, n_dim), 7.0, np.float32), dtype)
    for name in ("dx1", "dx2"):
        outputs[name][...] = sentinel
    (most, _, _), block, _ = kernel.launch_config(n, n_dim)
    emulate = pytest.importorskip("cek.emulate")
    emulate.load(kernel, schedule="random:1")((grid or most,), block, args)
    want, size = check.expected(kernel, inputs, 0.1)
    for name in ("dx1", "dx2"):
        assert (outputs[name][kept] == sentinel[kept]).all(), f"{name}: a kept row was written"
        _, _, failures = check.compare({name: outputs[name][~kept]}, {name: want[name][~kept]},
                                       {name: size[name][~kept]}, dtype)
        assert not failures, failures


@pytest.mark.emulator
def test_kept_rows_read_only_their_dy():
    """Counted byte by byte: with every row kept, the keep kernel reads dy alone (an upstream
    gradient of 1 after the fused forward costs O(N) bytes; one dy for every row, one value);
    with none kept, its whole pass."""
    emulate = pytest.importorskip("cek.emulate")
    kernel = split.CosineEmbeddingLossSplitBackwardKeep.for_dtype()
    n, n_dim = 3, 4097
    inputs = check.make_inputs(n, n_dim, seed=2)
    inputs = check.with_first(kernel, check.emulator_launcher(), inputs, 0.0)
    for case in ("per row", "one", "none kept"):
        if case == "per row":
            inputs["dy"][:] = np.float32(1.0)
        elif case == "one":
            inputs["dy"], inputs["dy_stride"] = np.ones((), np.float32), 0
        else:
            inputs["dy"], inputs["dy_stride"] = np.full(n, 0.5, np.float32), 1
        args, _ = check.build_args(kernel, inputs, 0.0)
        counts = emulate.traffic(kernel, (2,), kernel.launch_config(n, n_dim)[1], args)
        assert counts["dy"].read == counts["dy"].size
        for name in ("x1", "x2", "y", "sums", "dx1", "dx2"):
            touched = counts[name].read + counts[name].written
            assert touched == (counts[name].size if case == "none kept" else 0), (case, name)


# -- where the launchers split, and the launch contract -----------------------------------------

@pytest.mark.parametrize("n_rows, n_dim, dtype, want", [
    (8, 1 << 20, "bf16", True), (16, 32768, "f32", True),  # too few rows to keep DRAM busy
    (140, 32768, "f32", True),  # a nearly empty second wave of one block a row
    (48, 1 << 20, "f32", False),  # the model's two within 1%: no launch more
    (256, 32768, "f32", False), (256, 32768, "bf16", False), (200, 32768, "f32", False),
    # One row just past the register path: the split's 3 to 5 blocks each issue a whole
    # block's sums, which the model counts since it takes instruction issue from the SASS
    # (cek/split_model.py); at the copy rate it had split them.
    (1, 16385, "f32", False), (2, 16385, "f32", False), (5, 16385, "f16", False),
    (1, 32768, "f32", True), (3, 65536, "bf16", True),  # rows enough for the split's blocks
    (140, 32768, "bf16", False),  # the 16-bit fused-split: 71% of issue slots, L2 no help
    (264, 32768, "f32", False),  # SPLIT_BELOW_ROWS: one block a row streams them
    (48, 16384, "f32", False),  # the register path: one block holds the row
    (1, 8193, "f64", False), (1, 8192, "f64", False), (1, 32768, "f64", True),
    (4096, (1 << 20) + 1, "f32", True),  # wider than one block per row takes: split at any N
    (0, 32768, "f32", False),
])
def test_where_the_launchers_split(n_rows, n_dim, dtype, want):
    assert split.splits(n_rows, n_dim, dtype) is want
    # the grid's limit is checked with the most blocks a row can take: S past 2^20 only
    wide = n_dim > split.ONE_BLOCK_MAX_N_DIM
    assert split.blocks_per_row(n_rows, n_dim, dtype) == (split.slices(n_dim, dtype) if wide else 1)


@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "bf16"])
def test_the_launchers_split_where_the_model_says(dtype):
    """Below SPLIT_BELOW_ROWS (two waves of one block a row) on the streamed widths, splits() is
    cek.split_model's answer; from it, and on the register path, never; past 2^20, always."""
    from cek import split_model

    itemsize = dtypes.get(dtype).array.itemsize
    streamed = split.register_path_width(dtype) + 1
    for n_dim in (streamed, 32768, 100_000, 1 << 20):
        for n_rows in range(1, split.SPLIT_BELOW_ROWS + 40, 7):
            want = n_rows < split.SPLIT_BELOW_ROWS and split_model.prefers_split(
                n_rows, n_dim, itemsize)
            assert split.splits(n_rows, n_dim, dtype) is want, (n_rows, n_dim)
        assert not split.splits(1, streamed - 1, dtype)
        assert split.splits(10_000, (1 << 20) + 1, dtype)
    assert split.SPLIT_BELOW_ROWS == 2 * split_model.SMS


@pytest.mark.parametrize("dtype, width, widest", [("f32", 4096, 1 << 22), ("f16", 8192, 1 << 23),
                                                  ("bf16", 8192, 1 << 23), ("f64", 2048, 1 << 21)])
def test_slices_and_the_widest_row(dtype, width, widest):
    assert split.slice_width(dtype) == width and split.max_n_dim(dtype) == widest
    assert [split.slices(d, dtype) for d in (1, width, width + 1, widest)] == [1, 1, 2, 1024]
    kernel = split.CosineEmbeddingLossSplitFused.for_n_dim(widest, dtype)
    assert kernel.launch_config(3, widest) == ((3 * 1024, 1, 1), (1024, 1, 1), 0)
    forward = split.CosineEmbeddingLossSplitForward.for_n_dim(widest, dtype)
    assert forward.launch_config(3, widest)[0] == (3, 1, 1)  # a block a row
    with pytest.raises(ValueError, match=rf"n_dim must be an int in \[1, {widest}\]"):
        split.CosineEmbeddingLossSplitFused.for_n_dim(widest + 1, dtype)


def test_one_instance_a_dtype_with_the_slice_asserted_in_its_entry_point():
    kernel = split.CosineEmbeddingLossSplitFused.for_n_dim(70_001, "bf16")
    assert kernel == split.CosineEmbeddingLossSplitFused.for_dtype("bf16")
    assert kernel.id == "cosine_embedding_loss_split_fused__bf16__1024"
    assert kernel.block_sizes() == [1024] and kernel.max_threads == 1024
    entry = kernel.entry_point_source
    assert "static_assert(CekSplit<cek_bf16>::SLICE == 8192" in entry
    # two blocks an SM on sm_80, sm_90, sm_100 and sm_103; one on sm_70, where its 16-bit
    # narrowing takes an instruction a value (min_blocks_before_sm80), and on the archs whose
    # SM holds fewer than 2048 threads (sm_86 to sm_89, sm_101, sm_107 on), where ptxas would
    # ignore two with a warning
    assert ("__launch_bounds__(1024, __CUDA_ARCH__ >= 1070 ? 1 : __CUDA_ARCH__ >= 1030 ? 2 : "
            "__CUDA_ARCH__ >= 1010 ? 1 : __CUDA_ARCH__ >= 900 ? 2 : __CUDA_ARCH__ >= 860 ? 1 : "
            "__CUDA_ARCH__ >= 800 ? 2 : 1)") in entry
    double = split.CosineEmbeddingLossSplitFused(1024, "f64")
    assert "__launch_bounds__(1024, 1)" in double.entry_point_source
    assert "static_assert(CekSplit<cek_bf16>::SUMS_SLICES == 2" in entry
    assert ("cosine_embedding_loss_split_fused<1024, cek_bf16>(x1, x2, y, dy, dy_stride, scale, "
            "sums, loss, dx1, dx2, loss_out, y_out, n_rows") in entry
    keep = split.CosineEmbeddingLossSplitBackwardKeep
    # the keep kernel's loop over its slices: one block an SM in 16-bit types (its min_blocks)
    assert "__launch_bounds__(1024, 1)" in keep(1024, "bf16").entry_point_source
    # in float two, where the SM holds 2048 threads (sm_75's holds 1024)
    assert ("__launch_bounds__(1024, __CUDA_ARCH__ >= 1070 ? 1 : __CUDA_ARCH__ >= 1030 ? 2 : "
            "__CUDA_ARCH__ >= 1010 ? 1 : __CUDA_ARCH__ >= 900 ? 2 : __CUDA_ARCH__ >= 860 ? 1 : "
            "__CUDA_ARCH__ >= 800 ? 2 : __CUDA_ARCH__ >= 750 ? 1 : 2)") \
        in keep(1024, "f32").entry_point_source
    with pytest.raises(ValueError, match="runs 1024 threads: block_size must be 1024, got 512"):
        split.CosineEmbeddingLossSplitFused(512)


class _MisSliced(split.CosineEmbeddingLossSplitFused):
    """Says two chunks a thread where CekSplit holds one: a mirror out of step."""

    @property
    def chunks_held(self):
        return 2


@pytest.mark.compile
def test_the_compiler_refuses_a_slice_mirror_out_of_step():
    from cek.compile import CompileError

    with pytest.raises(CompileError) as info:
        compile_kernel(_MisSliced(1024), "sm_90")
    assert "cek/cosine_embedding_loss_split.py and CekSplit disagree on CHUNKS" in info.value.log


def test_a_launch_names_what_is_wrong_before_it_runs():
    kernel = split.CosineEmbeddingLossSplitFused.for_n_dim(9000)
    inputs = dict(check.make_inputs(2, 9000), sums=np.zeros((5, 4), np.float32))
    args, _ = check.build_args(kernel, inputs, 0.0)
    with pytest.raises(ValueError, match=r"sums must have shape \(6, 4\) for this problem \(\(n_rows "
                                         r"\* ceil\(n_dim / 4096\), 4\)\), got \(5, 4\)"):
        kernel.check_args(args, (np.ndarray,))
    with pytest.raises(ValueError, match="differ from launch_config"):
        kernel.check_launch((2, 1, 1), (1024, 1, 1), 2, 9000)  # a block a row: slices missed
    with pytest.raises(ValueError, match="more than a grid takes"):
        kernel.launch_config(2**30, 9000)


# -- gpu tier ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype, n_dim", [("f32", 32768), ("f32", (1 << 20) + 1),
                                          ("bf16", 70001), ("f64", 9000)])
@pytest.mark.parametrize("cls", [SUMS, *PAIRS], ids=_id)
def test_gpu_pairs_match_the_reference(cls, dtype, n_dim):
    launch = check.gpu_launcher()
    rows = 1 if n_dim > 100_000 else 3
    _passes(check.run_case(cls.for_n_dim(n_dim, dtype), launch, "gpu",
                           _inputs(cls, rows, n_dim, 1, dtype), 0.25))


@pytest.mark.gpu
@pytest.mark.parametrize("n_rows, n_dim", [(8, 1 << 20), (140, 32768)])
def test_gpu_split_step_is_the_same_bits_launch_after_launch(n_rows, n_dim):
    """cek.functional's fused mean at the split's target shapes: the pair, then the
    reduction, 10 times, the same bits each time, and the float64 mean."""
    import cupy as cp

    import cek
    from cek.bench import mean_reference

    rng = cp.random.default_rng(0)
    x1 = rng.standard_normal((n_rows, n_dim), dtype=cp.float32)
    x2 = 0.5 * x1 + rng.standard_normal((n_rows, n_dim), dtype=cp.float32)
    y = cp.where(rng.random(n_rows) < 0.5, 1.0, -1.0).astype(cp.float32)
    assert split.splits(n_rows, n_dim, "f32")
    first = [cp.asnumpy(a) for a in cek.cosine_embedding_loss_fused(x1, x2, y, 0.1)]
    for _ in range(9):
        again = [cp.asnumpy(a) for a in cek.cosine_embedding_loss_fused(x1, x2, y, 0.1)]
        assert all(a.tobytes() == b.tobytes() for a, b in zip(first, again))
    want = mean_reference(cp, x1, x2, y, 0.1, "f32")
    assert abs(float(first[0]) - want) <= 1e-4 * abs(want) + 1e-5
