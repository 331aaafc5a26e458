"""The mean and the sum written by the kernels themselves (cek_reduce_loss in kernels/cek_row.cuh).

The fused kernel and the forward row groups add per-block partial sums in block order in the
last block to finish. The emulator runs blocks one after another in the order a schedule gives,
so "the last block" is a different block under each schedule: the reduced value must be the same
bits under all of them, within TOLERANCES of the float64 mean or sum, with the counter back at 0.
"""

import numpy as np
import pytest

from cek import check, dtypes
from cek.cosine_embedding_loss_forward import CosineEmbeddingLossForwardRows
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused

emulate = pytest.importorskip("cek.emulate")

pytestmark = pytest.mark.emulator

SCHEDULES = ("forward", "reverse", "random:1", "random:2")
KERNELS = (CosineEmbeddingLossFused, CosineEmbeddingLossForwardRows)
# 33: row groups (16 rows a float block: 37 rows leave the last block part full), 769: one
# block per row, 16385: streamed.
CASES = [(37, 33), (7, 769), (1, 33), (1, 769), (3, 16385)]


def launch(kernel, inputs, margin=0.25, schedule="forward"):
    n_rows, n_dim = inputs["x1"].shape
    args, outputs = check.build_args(kernel, inputs, margin)
    grid, block, smem = kernel.launch_config(n_rows, n_dim)
    emulate.load(kernel, schedule=schedule)(grid, block, args, shared_mem=smem)
    counter = args[[a.name for a in kernel.args].index("counter")]
    return outputs, counter


def reduced_bits(outputs):
    return np.asarray(outputs["reduced"]).tobytes()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("n_rows, n_dim", CASES, ids=[f"{n}x{d}" for n, d in CASES])
@pytest.mark.parametrize("cls", KERNELS, ids=lambda c: c.short_name)
def test_reduced_loss_is_the_same_bits_under_every_schedule(cls, n_rows, n_dim, dtype, reduction):
    if n_dim == 16385 and dtype not in ("f32", "bf16"):
        pytest.skip("the streamed path is covered in float and bfloat16")
    kernel = cls.for_n_dim(n_dim, dtype)
    inputs = dict(check.make_inputs(n_rows, n_dim, dtype=dtype), reduction=reduction)
    inputs["dy"] = None
    bits = set()
    for schedule in SCHEDULES:
        outputs, counter = launch(kernel, inputs, schedule=schedule)
        assert int(counter) == 0, f"{schedule}: the counter is {int(counter)} after the launch"
        _, _, failures = check.compare(outputs, *check.expected(kernel, inputs, 0.25), dtype)
        assert not failures, (schedule, failures)
        bits.add(reduced_bits(outputs))
    assert len(bits) == 1, f"{kernel.id}: {len(bits)} different reduced values over {SCHEDULES}"


@pytest.mark.parametrize("cls", KERNELS, ids=lambda c: c.short_name)
@pytest.mark.parametrize("n_dim", [33, 769])
def test_the_per_row_loss_is_still_written_beside_the_reduced_one(cls, n_dim):
    """Asked for both, the kernel writes every row's loss (prefilled with NaN) as without the
    reduction, the same bits, and the reduced value of those losses."""
    kernel = cls.for_n_dim(n_dim)
    inputs = dict(check.make_inputs(21, n_dim), dy=None)
    plain, _ = launch(kernel, inputs)
    both, counter = launch(kernel, dict(inputs, reduction="mean"))
    per_row = "loss" if kernel.kind == "fused" else "out"
    assert "reduced" not in plain
    assert np.array_equal(both[per_row], plain[per_row])
    want, size = check.expected(kernel, dict(inputs, reduction="mean"), 0.25)
    assert set(want) >= {per_row, "reduced"}
    _, _, failures = check.compare(both, want, size)
    assert not failures and int(counter) == 0, failures


@pytest.mark.parametrize("cls", KERNELS, ids=lambda c: c.short_name)
@pytest.mark.parametrize("n_dim", [33, 769])
def test_a_nan_row_makes_the_reduced_loss_nan(cls, n_dim):
    kernel = cls.for_n_dim(n_dim)
    inputs = dict(check.make_inputs(19, n_dim), reduction="sum", dy=None)
    inputs["x2"][5, 3] = np.nan  # row 5: label -1 (LABELS cycle), a NaN loss
    assert inputs["y"][5] == -1.0
    outputs, counter = launch(kernel, inputs, schedule="reverse")
    assert np.isnan(outputs["reduced"]) and int(counter) == 0


def test_the_counter_serves_launch_after_launch():
    """One counter, zeroed once, and partials reused: each launch finds the counter at 0 and
    leaves it there, as a CUDA graph replaying the launch needs."""
    kernel = CosineEmbeddingLossFused.for_n_dim(33)
    inputs = dict(check.make_inputs(37, 33), reduction="mean", dy=None)
    args, outputs = check.build_args(kernel, inputs, 0.25)
    grid, block, smem = kernel.launch_config(37, 33)
    run = emulate.load(kernel, schedule="random:3")
    results = []
    for _ in range(3):
        outputs["reduced"][...] = np.nan
        run(grid, block, args, shared_mem=smem)
        results.append(reduced_bits(outputs))
        assert int(args[[a.name for a in kernel.args].index("counter")]) == 0
    assert len(set(results)) == 1
    assert abs(float(outputs["reduced"]) - check.expected_reduced(inputs, 0.25)) <= 1e-5


def test_bfloat16_reduced_loss_is_rounded_once_from_float():
    """The reduced value in bfloat16 is the float32 total times the scale, rounded once: the
    float64 mean rounded to bfloat16 is at most one bfloat16 step away."""
    kernel = CosineEmbeddingLossFused.for_n_dim(769, "bf16")
    inputs = dict(check.make_inputs(9, 769, dtype="bf16"), reduction="mean", dy=None)
    outputs, _ = launch(kernel, inputs)
    got = float(dtypes.to_float64(outputs["reduced"], "bf16"))
    want = check.expected_reduced(inputs, 0.25)
    assert abs(got - want) <= abs(want) * 2.0**-8


def _per_row_name(kernel):
    return "loss" if kernel.kind == "fused" else "out"


@pytest.mark.parametrize("cls", KERNELS, ids=lambda c: c.short_name)
@pytest.mark.parametrize("n_rows, n_dim", [(37, 33), (7, 769), (3, 16385)])
def test_without_the_per_row_loss_nothing_of_size_n_is_written(cls, n_rows, n_dim):
    """loss (out) = None with the reduced loss: the same reduced bits and gradients as with it,
    and the kernel never touches the per-row buffer (the traffic counter watches a None argument
    where the array would be and fails the launch on any access): A*N bytes fewer."""
    kernel = cls.for_n_dim(n_dim)
    inputs = dict(check.make_inputs(n_rows, n_dim), reduction="mean", dy=None)
    both, _ = launch(kernel, inputs, schedule="reverse")
    args, outputs = check.build_args(kernel, inputs, 0.25)
    names = [a.name for a in kernel.args]
    args = list(args)
    args[names.index(_per_row_name(kernel))] = None
    grid, block, smem = kernel.launch_config(n_rows, n_dim)
    counts = emulate.traffic(kernel, grid, block, args, shared_mem=smem, schedule="reverse")
    assert _per_row_name(kernel) not in counts
    assert reduced_bits(outputs) == reduced_bits(both)
    for name in ("dx1", "dx2"):
        if name in both:
            assert np.array_equal(outputs[name], both[name])
    written = sum(t.written for name, t in counts.items() if name not in ("partials", "counter"))
    grads = sum(both[name].nbytes for name in ("dx1", "dx2") if name in both)
    assert written == grads + outputs["reduced"].nbytes, counts


@pytest.mark.parametrize("cls", KERNELS, ids=lambda c: c.short_name)
def test_no_per_row_loss_without_the_reduced_one_is_refused(cls):
    kernel = cls.for_n_dim(33)
    inputs = dict(check.make_inputs(5, 33), dy=None)
    args, outputs = check.build_args(kernel, inputs, 0.25)
    args = list(args)
    args[[a.name for a in kernel.args].index(_per_row_name(kernel))] = None
    with pytest.raises(ValueError, match=f"{_per_row_name(kernel)} may be None only with the "
                                         "reduced loss"):
        emulate.load(kernel)(*kernel.launch_config(5, 33)[:2], args)
