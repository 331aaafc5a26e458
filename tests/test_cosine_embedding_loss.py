"""The kernels against the float64 reference: on the CPU emulator (CI) and on a GPU (gpu tier).

Every output is prefilled with NaN (cek.check.build_args), so an element a kernel forgot to write
fails. Tolerances are the table cek.check.TOLERANCES, shared with `cek check`.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cek import check, dtypes, kernel_paths, reference
from cek.kernel import RowGroups, kernel_classes
from oracle import KEPT, reference_on_scaled_copies

# The one-block-per-row kernels and their row-group variants; the split's pairs run in
# tests/test_cosine_embedding_loss_split.py.
KERNELS = [cls for cls in kernel_classes().values() if cls.first is None and cls.kind != "sums"]
# 3000: float rows of 2049..4096 hold two chunk pairs a thread, the second past the row's end in
# the last threads
DIMS = [1, 2, 3, 31, 32, 33, 127, 128, 129, 384, 768, 769, 1000, 1024, 3000, 4096]
ROWS = [1, 7, 64]
MARGINS = [-0.5, 0.0, 0.5]
# 5377 and 5888: tailed rows, 672 threads, an element past the chunks
GPU_DIMS = [1, 3, 31, 32, 33, 127, 768, 769, 1000, 1024, 4096, 5377, 5888]


OTHER_DTYPES = ["f64", "f16", "bf16"]
# Per element size: row groups, one warp, several warps, chunk tails, the widest register row
# and the first streamed one (f64 streams past 8192, the others past 16384). 3000: 16-bit rows of
# 1025 and more hold two chunk pairs a thread, the second past the row's end in the last threads.
OTHER_DIMS = [1, 3, 8, 33, 129, 512, 769, 3000, 4096, 8193, 16385]
LARGE_DIMS = [16385, 70_001, 1 << 20]


def _cases(dims, dtype="f32"):
    """(kernel class, n_dim) pairs, leaving out a *_rows variant where its rows are too wide for
    row groups and it runs its twin's code (tested with the twin), except at 768: that the
    variant gets there is tested once."""
    return [(cls, d) for cls in KERNELS for d in dims
            if d == 768 or not cls.for_n_dim(d, dtype).runs_twin_code]


def _id(case):
    return case.name.removeprefix("cosine_embedding_loss_") if isinstance(case, type) else None


def _inputs(kernel_cls, n_rows, n_dim, seed=0, dtype="f32"):
    inputs = check.make_inputs(n_rows, n_dim, seed, dtype=dtype)
    if kernel_cls.name.endswith("_fused") and seed % 2:
        inputs["dy"], inputs["scale"] = None, 1.0 / n_rows  # the mean: no dy array
    elif kernel_cls.name.endswith("_fused"):
        inputs["scale"] = 0.5
    elif "dy_stride" in {a.name for a in kernel_cls.args}:  # backward-rows and -keep
        # as cek's launchers run them: a mean's 0-d gradient read for every row, or one a row
        # scaled
        if seed % 2:
            inputs.update(dy=inputs["dy"][:1].reshape(()), dy_stride=0, scale=1.0 / n_rows)
        else:
            inputs["scale"] = 0.5
    return inputs


def _assert_passes(result):
    assert result.passed, result.detail


@pytest.fixture(scope="module")
def emulator():
    pytest.importorskip("cek.emulate")
    return {s: check.emulator_launcher(schedule=s)
            for s in ("forward", "random:1", "random:2")}


@pytest.mark.emulator
@pytest.mark.parametrize("n_rows", ROWS)
@pytest.mark.parametrize("cls, n_dim", _cases(DIMS), ids=_id)
def test_emulator_matches_reference(emulator, cls, n_rows, n_dim):
    kernel = cls.for_n_dim(n_dim)
    for seed, margin in enumerate(MARGINS):
        inputs = _inputs(cls, n_rows, n_dim, seed)
        _assert_passes(check.run_case(kernel, emulator["forward"], "cpu", inputs, margin))
    # Other thread orders: a missing barrier or a racy reduction shows up as different numbers.
    for seed, schedule in ((3, "random:1"), (4, "random:2")):
        inputs = _inputs(cls, n_rows, n_dim, seed)
        margin = MARGINS[seed % 3]
        _assert_passes(check.run_case(kernel, emulator[schedule], "cpu", inputs, margin))


@pytest.mark.emulator
@pytest.mark.parametrize("dtype, cls, n_dim", [(t, c, d) for t in OTHER_DTYPES
                                                 for c, d in _cases(OTHER_DIMS, t)], ids=_id)
def test_emulator_matches_reference_in_other_dtypes(emulator, cls, n_dim, dtype):
    kernel = cls.for_n_dim(n_dim, dtype)
    for seed, (margin, schedule) in enumerate(((-0.5, "forward"), (0.5, "random:1"))):
        inputs = _inputs(cls, 7, n_dim, seed, dtype)
        _assert_passes(check.run_case(kernel, emulator[schedule], "cpu", inputs, margin))


GROUPED = [cls for cls in KERNELS if issubclass(cls, RowGroups)]


@pytest.mark.emulator
@pytest.mark.parametrize("dtype, n_dim", [("f32", 1), ("f32", 3), ("f32", 33), ("f32", 128),
                                          ("f32", 129), ("f64", 33), ("bf16", 129),
                                          ("f16", 256), ("bf16", 768), ("f16", 1000)])
@pytest.mark.parametrize("cls", GROUPED, ids=_id)
def test_row_groups_over_several_blocks_and_a_partial_last_one(emulator, cls, n_dim, dtype):
    # 300 rows: more than one 256-thread block holds at every GROUP, a multiple of none, so the
    # last block has lanes without a row and a grid rounded down would drop rows.
    kernel = cls.for_n_dim(n_dim, dtype)
    assert kernel.grouped and kernel.launch_config(300, n_dim)[0][0] > 1
    inputs = _inputs(cls, 300, n_dim, seed=n_dim, dtype=dtype)
    _assert_passes(check.run_case(kernel, emulator["random:1"], "cpu", inputs, 0.25))


@pytest.mark.emulator
@pytest.mark.parametrize("cls, n_dim", _cases(LARGE_DIMS), ids=_id)
def test_emulator_streams_rows_too_wide_for_registers(emulator, cls, n_dim):
    kernel = cls.for_n_dim(n_dim)
    assert kernel.streamed
    _assert_passes(check.run_case(kernel, emulator["forward"], "cpu", _inputs(cls, 2, n_dim), 0.0))


def _misaligned(inputs):
    """x1 and x2 as views one element into a buffer: rows not 16-byte aligned."""
    for name in ("x1", "x2"):
        buf = np.empty(inputs[name].size + 1, inputs[name].dtype)
        view = buf[1:].reshape(inputs[name].shape)
        view[...] = inputs[name]
        assert view.ctypes.data % 16 != 0
        inputs[name] = view
    return inputs


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["f32"] + OTHER_DTYPES)
@pytest.mark.parametrize("cls", KERNELS, ids=_id)
@pytest.mark.parametrize("n_dim", [8, 768, 1000])
def test_misaligned_views_take_the_scalar_path(emulator, cls, n_dim, dtype):
    # Rows of a view one element into a buffer are not 16-byte aligned: a 128-bit access would
    # fault (the emulator reports it as a GPU would).
    inputs = _misaligned(_inputs(cls, 5, n_dim, dtype=dtype))
    kernel = cls.for_n_dim(n_dim, dtype)
    _assert_passes(check.run_case(kernel, emulator["forward"], "cpu", inputs, 0.0))


# Rows of 5377..5888 floats run 672 threads, three blocks an SM, and each thread holds one element
# past its chunks (CekTiling::TAILED): the last element of a 5377-wide row, all 512 past the
# chunks of a 5888-wide one. A forgotten element leaves a NaN in the gradient or a wrong loss;
# 5377 and the misaligned view take the scalar path. 16-bit rows there hold two chunk pairs a
# thread (352..384 threads), their gradient widened again from the held pairs
# (cek_chunk_to_acc_again): a 5377-wide row's last chunk is one element.
@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("cls", KERNELS, ids=_id)
@pytest.mark.parametrize("n_dim, view", [(5377, False), (5600, True), (5888, False)])
def test_tailed_rows_hold_an_element_past_their_chunks(emulator, cls, n_dim, view, dtype):
    kernel = cls.for_n_dim(n_dim, dtype)
    threads = kernel.launch_config(7, n_dim)[1][0]
    if dtype == "f32":
        assert threads == 672 < n_dim / (kernel.chunks_per_thread * kernel.vec)
    else:
        assert not kernel.tailed and kernel.chunks_per_thread == 2 and threads * 16 >= n_dim
    for seed, (margin, schedule) in enumerate(((-0.5, "forward"), (0.5, "random:1"))):
        inputs = _inputs(cls, 7, n_dim, seed, dtype)
        if view:
            inputs = _misaligned(inputs)
        _assert_passes(check.run_case(kernel, emulator[schedule], "cpu", inputs, margin))


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["f32"] + OTHER_DTYPES)
def test_nan_in_a_row_reaches_its_loss_and_gradient(emulator, dtype):
    cls = kernel_classes()["fused"]
    inputs = _inputs(cls, 4, 768, dtype=dtype)
    inputs["y"][:] = [1, -1, 0, 1]
    inputs["x1"][:3, 5] = dtypes.from_float(np.float32(np.nan), dtype)
    args, outputs = check.build_args(cls.for_n_dim(768, dtype), inputs, 0.0)
    emulator["forward"](cls.for_n_dim(768, dtype), args)
    assert np.isnan(outputs["loss"][:2]).all() and outputs["loss"][2] == 0  # torch: label 0 -> 0
    for name in ("dx1", "dx2"):
        values = dtypes.to_float64(outputs[name], dtype)
        assert np.isnan(values[:3]).all() and np.isfinite(values[3]).all()


# Every path of every kernel (row groups, one block a row, tailed and streamed rows, each with a
# huge row; the keep kernels' loops; the split's pairs; the reduction's levels) in float32 and
# bfloat16, at the smallest problem that reaches it: cek.kernel_paths, which `cek check
# --sanitize` runs too. A barrier missing between two uses of shared memory is a race the
# emulator's schedule may hide and ThreadSanitizer names.
@pytest.mark.emulator
@pytest.mark.parametrize("sanitize", ["thread", "address"])
@pytest.mark.parametrize("path", kernel_paths.paths(), ids=lambda p: p.id)
def test_sanitizers_find_nothing_in_the_kernels(path, sanitize):
    pytest.importorskip("cek.emulate")
    _assert_passes(kernel_paths.run(path, check.emulator_launcher(sanitize=sanitize)))


def test_the_sanitized_paths_are_each_paths_smallest_problem():
    """Each row kernel's path list names every path its tiling has, each at the narrowest row
    that takes it (one element less takes another path), with a huge row in its problem."""
    found = kernel_paths.paths()
    for dtype in kernel_paths.DTYPES:
        fused = {p.what: p.n_dim for p in found if p.kernel == "fused" and p.dtype == dtype}
        assert "one block a row, streamed" in fused
        assert any(w.startswith("row groups, a warp a row") for w in fused)
        assert any(w.startswith("row groups, lanes of a warp") for w in fused)
        assert sum(p.kernel == kernel_paths.REDUCE and p.dtype == dtype for p in found) == 3
    tailed = [p for p in found if "an element past the chunks" in p.what]
    assert {p.kernel for p in tailed} == {"backward", "forward", "fused", "backward-keep"}
    for path in found:
        if path.kernel == kernel_paths.REDUCE or kernel_classes()[path.kernel].first:
            continue
        cls = kernel_classes()[path.kernel]
        kernel = cls.for_n_dim(path.n_dim, path.dtype)
        what = kernel_paths.tiling(kernel, path.n_dim)
        assert path.what.startswith(what)
        if path.n_dim > 1:
            narrower = cls.for_n_dim(path.n_dim - 1, path.dtype)
            assert kernel_paths.tiling(narrower, path.n_dim - 1) != what, path
        x1 = dtypes.to_float64(kernel_paths.inputs(path, kernel)["x1"], path.dtype)
        assert (x1[-1] ** 2).sum() >= 2.0**64  # the last row takes the huge rows' branch


@pytest.mark.emulator
def test_schedules_give_bitwise_identical_results(emulator):
    cls = kernel_classes()["fused"]
    results = []
    for schedule in ("forward", "random:1", "random:2"):
        args, outputs = check.build_args(cls.for_n_dim(1000), _inputs(cls, 7, 1000), 0.0)
        emulator[schedule](cls.for_n_dim(1000), args)
        results.append(outputs)
    for other in results[1:]:
        for name in results[0]:
            assert np.array_equal(results[0][name], other[name])


# -- properties ------------------------------------------------------------------------------

PROPERTY = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
dims = st.sampled_from([1, 3, 32, 33, 100, 768])


def _run(emulator, name, inputs, margin=0.0):
    kernel = kernel_classes()[name].for_n_dim(inputs["x1"].shape[1])
    args, outputs = check.build_args(kernel, inputs, margin)
    emulator["forward"](kernel, args)
    return outputs


@pytest.mark.emulator
@PROPERTY
@given(n_dim=dims, seed=st.integers(0, 2**16))
def test_loss_of_identical_rows_with_label_1_is_zero(emulator, n_dim, seed):
    inputs = check.make_inputs(4, n_dim, seed, zero_row=False)
    inputs["x2"] = inputs["x1"].copy()
    inputs["y"][:] = 1.0
    loss = _run(emulator, "forward", inputs)["out"]
    np.testing.assert_allclose(loss, 0.0, atol=1e-5)


@pytest.mark.emulator
@PROPERTY
@given(n_dim=dims, seed=st.integers(0, 2**16), factor=st.floats(1e-3, 1e3))
def test_loss_is_invariant_to_scaling_x1(emulator, n_dim, seed, factor):
    inputs = check.make_inputs(4, n_dim, seed, zero_row=False)
    scaled = (inputs["x1"] * np.float32(factor)).astype(np.float32)
    # The invariance is exact only while EPS = 1e-12 is negligible beside each squared norm.
    assume(np.min(np.einsum("ij,ij->i", scaled, scaled)) > 1e-4)
    base = _run(emulator, "forward", inputs, 0.1)["out"]
    inputs["x1"] = scaled
    np.testing.assert_allclose(_run(emulator, "forward", inputs, 0.1)["out"], base, atol=1e-5)


@pytest.mark.emulator
@PROPERTY
@given(n_dim=dims, seed=st.integers(0, 2**16), margin=st.floats(-1, 1))
def test_loss_is_between_0_and_2(emulator, n_dim, seed, margin):
    loss = _run(emulator, "forward", check.make_inputs(7, n_dim, seed), margin)["out"]
    # In float32 |c| may exceed 1 by a rounding or two (at D = 1, c = x1*x2*r1*r2 with each
    # factor rounded), as in PyTorch; neither clamps c, so the bounds hold to a few ulps of 1.
    ulps = 4 * np.finfo(np.float32).eps
    assert np.all(loss >= -ulps) and np.all(loss <= 2 + ulps), loss


@pytest.mark.emulator
@PROPERTY
@given(n_dim=st.sampled_from([1, 3, 5, 33]), seed=st.integers(0, 2**16),
       margin=st.sampled_from(MARGINS))
def test_gradients_match_finite_differences_of_the_reference(emulator, n_dim, seed, margin):
    inputs = check.make_inputs(4, n_dim, seed, zero_row=False)
    x1, x2 = inputs["x1"].astype(np.float64), inputs["x2"].astype(np.float64)
    y, dy = inputs["y"], inputs["dy"].astype(np.float64)
    c, _, _ = reference.cosine(x1, x2)
    if np.any(np.abs(c - margin) < 1e-3):
        return  # a step of h could cross the hinge at c = margin
    got = _run(emulator, "backward", inputs, margin)
    h = 1e-6
    objective = lambda a, b: np.dot(dy, reference.forward(a, b, y, margin))  # noqa: E731
    sizes = reference.gradient_magnitudes(dy, x1, x2, y, margin)
    for name, which, size in (("dx1", 0, sizes[0]), ("dx2", 1, sizes[1])):
        num = np.zeros_like(x1)
        for idx in np.ndindex(x1.shape):
            plus, minus = [x1.copy(), x2.copy()], [x1.copy(), x2.copy()]
            plus[which][idx] += h
            minus[which][idx] -= h
            num[idx] = (objective(*plus) - objective(*minus)) / (2 * h)
        # Central differences carry ~1e-10 of rounding (1e-16 / h); the float32 kernel's error
        # scales with the two terms each gradient is the difference of (cek.check.TOLERANCES).
        err = np.abs(got[name] - num)
        assert np.all(err <= 1e-3 * np.abs(num) + 1e-4 * size + 1e-8), (name, got[name], num)


# -- gpu tier ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("cls", KERNELS, ids=_id)
@pytest.mark.parametrize("n_dim", GPU_DIMS + [16384])
def test_gpu_matches_reference(cls, n_dim):
    launch = check.gpu_launcher()
    for seed, margin in enumerate(MARGINS):
        for n_rows in (1, 7, 300):
            inputs = _inputs(cls, n_rows, n_dim, seed)
            _assert_passes(check.run_case(cls.for_n_dim(n_dim), launch, "gpu", inputs, margin))


@pytest.mark.emulator
@pytest.mark.parametrize("cls", KERNELS, ids=_id)
def test_the_gpu_tiers_launcher_on_the_stand_in(monkeypatch, cls):
    """test_gpu_matches_reference's launches (check.gpu_launcher: the arrays copied in, the
    outputs copied back) on the stand-in for CuPy with the emulator as the GPU, at one small
    width, so that the gpu tier's way is checked in CI before it meets a GPU."""
    import fake_cupy

    fake_cupy.install(monkeypatch)
    launch = check.gpu_launcher()
    for seed, margin in enumerate(MARGINS):
        _assert_passes(check.run_case(cls.for_n_dim(33), launch, "gpu",
                                      _inputs(cls, 7, 33, seed), margin))


@pytest.mark.parametrize("where", [pytest.param("stand-in", marks=pytest.mark.emulator),
                                   pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("cls", KERNELS, ids=_id)
def test_gpu_misaligned_views(monkeypatch, cls, where):
    """Rows one element into their device buffers, launched through cek.gpu.launch: on a GPU,
    and on the stand-in for CuPy with the emulator as the GPU (tests/fake_cupy.py), so that the
    way this test builds its views is checked in CI before it meets a GPU."""
    if where == "stand-in":
        import fake_cupy

        fake_cupy.install(monkeypatch)
    import cupy

    from cek import gpu

    kernel = cls.for_n_dim(768)
    inputs = _inputs(cls, 9, 768)
    args, outputs = check.build_args(kernel, inputs, 0.0)
    device_args = []
    for spec, value in zip(kernel.args, args):
        if isinstance(value, np.ndarray) and value.ndim == 2:
            buf = cupy.empty(value.size + 1, cupy.float32)
            view = buf[1:].reshape(value.shape)
            view[...] = cupy.asarray(value)
            device_args.append(view)
        else:
            device_args.append(cupy.asarray(value) if isinstance(value, np.ndarray) else value)
    gpu.launch(kernel, *device_args)
    for spec, host, dev in zip(kernel.args, args, device_args):
        if spec.output:
            host[...] = cupy.asnumpy(dev)
    _, _, failures = check.compare(outputs, *check.expected(kernel, inputs, 0.0))
    assert not failures, failures


@pytest.mark.emulator
def test_float32_subnormals_flush_to_zero_as_on_a_gpu(emulator):
    # CuPy compiles with -ftz=true, so on a GPU float32 subnormal inputs read as zeros, and the
    # emulator flushes the same way. With x1 = x2 = t, EPS dominates the norms and the exact
    # gradient is dx1 = -dy*t*r^2 ~ -t*1e12, a normal number: 0 once t is flushed. float64
    # kernels are not flushed on either.
    cls = kernel_classes()["backward"]
    for dtype, t in (("f32", 1e-39), ("f64", 1e-310)):
        d = dtypes.get(dtype)
        x = np.full((1, 8), t, d.array)
        inputs = {"x1": x, "x2": x.copy(), "y": np.ones(1, d.acc), "dy": np.ones(1, d.acc),
                  "dtype": dtype}
        kernel = cls.for_n_dim(8, dtype)
        args, outputs = check.build_args(kernel, inputs, 0.0)
        emulator["forward"](kernel, args)
        exact, _ = reference.backward(inputs["dy"], x, x, inputs["y"])
        assert exact[0, 0] < 0 and np.isfinite(exact).all()
        if dtype == "f32":
            assert np.all(outputs["dx1"] == 0)
        else:
            np.testing.assert_allclose(outputs["dx1"], exact, rtol=1e-10)
    # Python's own arithmetic keeps its subnormals after a launch.
    assert np.float32(1e-39) * np.float32(1) != 0


# -- rows too large for a plain float32 squared norm -----------------------------------------

# row groups, one block per row (16-bit rows of 769 run row groups in the fused and *_rows
# kernels, four chunk pairs a lane summed again from registers; the streamed path: f32 below)
HUGE_WIDTHS = [33, 769]


def _huge_rows(n_dim, dtype):
    """Eight rows of float64 values for `dtype`: ordinary, zero, at its largest finite value,
    huge x1 beside an ordinary or a tiny x2, x2 = x1, x2 = -x1, and just past where float32's
    squared norm overflows. Values are powers of two times make_inputs' rows, so exact."""
    base = check.make_inputs(8, n_dim, seed=n_dim, dtype="f32")
    x1, x2 = base["x1"].astype(np.float64), base["x2"].astype(np.float64)
    top = float(np.finfo(dtypes.get(dtype).array if dtype != "bf16" else np.float32).max)
    if dtype == "bf16":
        top = float(dtypes.to_float64(np.array([0x7F7F], np.uint16), "bf16")[0])
    big = 2.0 ** (np.frexp(top)[1] - 4)  # a power of two a row of ~N(0, 1) values stays under

    def at(row, bound):  # scaled by a power of two to a largest magnitude just under bound
        return row * 2.0 ** (np.frexp(bound)[1] - np.frexp(np.abs(row).max())[1] - 1)

    x1[1], x2[1] = at(x1[1], big), at(x2[1], big)
    x1[1, 0], x2[1, 3] = top, -top  # the largest finite value itself
    x1[2] = at(x1[2], big)
    x2[3] = at(x2[3], big)
    x1[4], x2[4] = at(x1[4], big / 16), at(x2[4], 2.0**-20)
    x1[5] = x2[5] = at(x1[5], big)
    x1[6] = at(x1[6], big)
    x2[6] = -x1[6]
    x1[7], x2[7] = at(x1[7], min(2.0**70, big)), at(x2[7], min(2.0**66, big))  # float32's sq1
    # overflows from 2^64
    return x1, x2, base


def _huge_cases():
    cases = [(cls, d, dtype) for dtype in ["f32"] + OTHER_DTYPES
             for cls, d in _cases(HUGE_WIDTHS, dtype) if d != 768]
    # 6000 floats: two chunk pairs a thread on the register path, whose huge rows are read again
    return cases + [(kernel_classes()[n], d, "f32") for n in ("forward", "fused")
                    for d in (6000, 16385)] + [(kernel_classes()["backward"], 6000, "f32")]


@pytest.mark.emulator
@pytest.mark.parametrize("cls, n_dim, dtype", _huge_cases(), ids=_id)
def test_rows_up_to_the_largest_finite_values_give_the_formulas_results(emulator, cls, n_dim,
                                                                         dtype):
    kernel = cls.for_n_dim(n_dim, dtype)
    x1, x2, base = _huge_rows(n_dim, dtype)
    acc = dtypes.get(dtype).acc
    inputs = {"x1": dtypes.from_float(x1, dtype), "x2": dtypes.from_float(x2, dtype),
              "y": np.array([1, -1] * 4, acc), "dy": dtypes.from_float(base["dy"], dtype),
              "scale": 0.5, "dtype": dtype}
    x1, x2 = dtypes.to_float64(inputs["x1"], dtype), dtypes.to_float64(inputs["x2"], dtype)
    assert np.isfinite(x1).all() and np.isfinite(x2).all()
    args, outputs = check.build_args(kernel, inputs, -0.5)
    emulator["random:1"](kernel, args)
    dy = check.upstream(inputs, len(inputs["y"]), kernel)  # scale * dy where the kernel takes it
    loss, dx1, dx2, m1, m2 = reference_on_scaled_copies(x1, x2, inputs["y"], dy, -0.5)
    if kernel.kind == "forward":
        got_loss = outputs["out"]
    else:
        got_loss = outputs.get("loss")
        rtol, atol = check.TOLERANCES[dtype, "grad"]
        for name, want, size in (("dx1", dx1, m1), ("dx2", dx2, m2)):
            got = dtypes.to_float64(outputs[name], dtype)
            bad = ~(np.abs(got - want) <= atol * size + rtol * np.abs(want) + KEPT[dtype])
            # float16: a gradient past its range is rightly infinite (as check.compare judges)
            bad &= ~((np.abs(want) >= dtypes.overflow_threshold(dtype))
                     & (got == np.copysign(np.inf, want)))
            assert not bad.any(), (name, np.argwhere(bad)[:3].tolist(), got[bad][:3], want[bad][:3])
    if got_loss is not None:
        rtol, atol = check.TOLERANCES[dtype, "loss"]
        np.testing.assert_allclose(got_loss, loss, rtol=rtol, atol=atol)
