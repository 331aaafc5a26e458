"""cek.plan is what every route runs: on the CuPy stand-in and the emulator (tests/fake_cupy.py),
the kernels cek.torch launches (eager, and through the custom ops that compiled code runs), cek's
functions on CuPy arrays and `cek bench` are the plan's, in order, on both sides of the split and
of the reduction's levels, with and without gradients, for every reduction. And `cek plan`."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from test_gpu_glue import _inputs, standin  # noqa: F401
from test_torch_cuda_glue import CudaLike, cuda  # noqa: F401

from cek import bench_providers, plan
from cek import functional as F
from cek.bench import Bench
from cek.cli import main

pytestmark = pytest.mark.emulator
torch = pytest.importorskip("torch")
import cek.torch as ct  # noqa: E402

# (N, D, dtype): row groups and one reduction launch; a few streamed rows, split; more losses
# than one block adds (65536 floats, 32768 doubles), the reduction's two levels.
SHAPES = [(7, 33, "f32"), (3, 65536, "f32"), (65537, 2, "f32"), (32769, 2, "f64")]
NUMPY = {"f32": np.float32, "f64": np.float64}
TORCH = {"f32": torch.float32, "f64": torch.float64}


def _ids(launches):
    return [launch.kernel.id for launch in launches]


def _plan(n, d, dtype, reduction, grads=True, route="torch"):
    return plan.plan(n, d, dtype, reduction=reduction, grads=grads, route=route)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("n,d,dtype", SHAPES)
def test_every_route_launches_its_plan(cuda, monkeypatch, n, d, dtype, reduction):  # noqa: F811
    x1, x2, y = _inputs(n, d, NUMPY[dtype], seed=n)
    # the split, and the reduction's two levels, are where the shapes say
    assert _plan(n, d, dtype, reduction).split == (d == 65536)
    two_levels = n > 30000 and reduction != "none"
    assert len([l for l in _plan(n, d, dtype, reduction).launches
                if l.name == "reduce"]) == (2 if two_levels else reduction != "none")

    def launched(run):
        cuda.launches.clear()
        run()
        return cuda.ids()

    # cek's functions on CuPy arrays: the loss, its backward, the fused call
    a1, a2, ay = (cuda.array(a) for a in (x1, x2, y))
    assert launched(lambda: F.cosine_embedding_loss(a1, a2, ay, 0.1, reduction)) == \
        _ids(_plan(n, d, dtype, reduction, grads=False).launches)
    assert launched(lambda: F.cosine_embedding_loss_backward(1.0, a1, a2, ay, 0.1, reduction)
                    if reduction != "none" else
                    F.cosine_embedding_loss_backward(cuda.array(np.ones(n, NUMPY[dtype])), a1,
                                                     a2, ay, 0.1, reduction)) == \
        _ids(_plan(n, d, dtype, reduction, route="torch-compile").of("backward"))
    assert launched(lambda: F.cosine_embedding_loss_fused(a1, a2, ay, 0.1, reduction)) == \
        _ids(_plan(n, d, dtype, reduction, route="functional").launches)

    # cek.torch: the forward alone, an eager step, a step through the custom ops
    t1, t2, ty = (torch.from_numpy(a) for a in (x1, x2, y))

    def step(grads):
        c1, c2 = (t.clone().as_subclass(CudaLike).requires_grad_(grads) for t in (t1, t2))
        with torch.set_grad_enabled(grads):
            loss = ct.cosine_embedding_loss(c1, c2, ty.as_subclass(CudaLike), 0.1,
                                            reduction=reduction)
        if grads:
            loss.sum().backward()

    # CudaLike is a tensor subclass, which cek.torch sends through the custom ops: here the
    # eager route is taken as for a plain CUDA tensor
    monkeypatch.setattr(ct, "_plain_eager", lambda *tensors: True)
    assert launched(lambda: step(False)) == \
        _ids(_plan(n, d, dtype, reduction, grads=False).launches)
    assert launched(lambda: step(True)) == _ids(_plan(n, d, dtype, reduction).launches)
    monkeypatch.setattr(ct, "_plain_eager", lambda *tensors: False)
    assert launched(lambda: step(True)) == \
        _ids(_plan(n, d, dtype, reduction, route="torch-compile").launches)

    # cek bench: its cek row of the fused kernel the plan runs at this shape ("none" and
    # "mean", what it times), launched once through every check as it is built
    if reduction != "sum":
        fused = _plan(n, d, dtype, reduction, route="functional").of("fused")
        row_kernel = next(l.kernel for l in fused if l.op == "fused" and l.name.startswith("fused"))
        bench = Bench(n, d, repeat=50, dtype=dtype)
        assert launched(lambda: bench_providers._cek_provider(bench, row_kernel, 0.1,
                                                              reduction)) == _ids(fused)


def test_the_plan_is_asked_not_repeated():
    """One Plan per signature (cached), its launches in op order, its workspace what its
    launches write and nothing more."""
    step = _plan(3, 65536, "f32", "mean")
    assert step is _plan(3, 65536, "f32", "mean")
    assert [l.op for l in step.launches] == ["fused"] * 3 + ["keep"]
    assert [b.name for b in step.workspace("fused")] == ["sums"]
    assert step.workspace("keep") == ()
    assert step.buffer("sums").shape == (3 * 16, 4)  # 65536 floats: 16 slices of 4096
    two = _plan(65537, 2, "f32", "sum", route="torch-compile")
    assert [b.name for b in two.workspace("forward")] == ["partials"]
    assert two.buffer("partials").shape == (3,)  # 32768 losses a block
    assert _plan(0, 1 << 30, "f32", "mean").launches == ()  # no rows: nothing, and no check


@pytest.mark.parametrize("bad,message", [
    (dict(n_rows=4, n_dim=1 << 23), "D up to 4194304"),
    (dict(n_rows=1 << 31, n_dim=4), "fewer than 2**31 rows"),
    (dict(n_rows=4, n_dim=4, dtype="f8"), "dtype must be one of"),
    (dict(n_rows=4, n_dim=4, reduction="max"), "reduction must be one of"),
    (dict(n_rows=4, n_dim=4, route="jax"), "route must be one of"),
    (dict(n_rows=4.0, n_dim=4), "n_rows must be an int"),
    (dict(n_rows=[4], n_dim=4), "n_rows must be an int"),
])
def test_a_bad_plan_is_a_value_error_naming_it(bad, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        plan.plan(**bad)


def test_cek_plan_prints_the_plan():
    runner = CliRunner()
    result = runner.invoke(main, ["plan", "--n-rows", "3", "--n-dim", "65536", "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    assert [l["kernel"] for l in got["launches"]] == ["split-sums", "fused-split", "reduce",
                                                        "backward-keep-split"]
    assert all(len(l["grid"]) == 3 and len(l["block"]) == 3 and
               all(isinstance(v, int) for v in l["grid"] + l["block"]) for l in got["launches"])
    assert got["launches"][0]["grid"] == [24, 1, 1]  # 48 slices, two a block
    assert got["launches"][1]["block"] == [1024, 1, 1]
    text = runner.invoke(main, ["plan", "--n-rows", "65537", "--n-dim", "768", "--no-grad"])
    assert text.exit_code == 0, text.output
    assert "forward-rows" in text.output and "workspace: partials [3] float32" in text.output
    assert "why: mean of 65537 losses" in text.output


@pytest.mark.parametrize("args,message", [
    (["--n-dim", "99999999"], "D up to 4194304"),
    (["--n-dim", "768", "--dtype", "f8"], "'f8' is not one of"),
    (["--n-dim", "0"], "n_dim must be a positive int"),
])
def test_cek_plan_refuses_a_bad_shape_in_one_line(args, message):
    result = CliRunner().invoke(main, ["plan", "--n-rows", "4", *args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_no_rows_ask_nothing_of_cupy(cuda, monkeypatch, reduction):  # noqa: F811
    """N = 0: the plan launches nothing, so cek.torch neither launches nor asks for CuPy (a
    host without it gets torch's value), with or without gradients."""
    from cek import gpu

    def no_cupy():
        raise AssertionError("CuPy asked for with nothing to launch")

    monkeypatch.setattr(gpu, "require_cupy", no_cupy)
    monkeypatch.setattr(ct, "_plain_eager", lambda *tensors: True)
    for grads in (False, True):
        x1, x2 = (torch.zeros(0, 5).as_subclass(CudaLike).requires_grad_(grads) for _ in "12")
        loss = ct.cosine_embedding_loss(x1, x2, torch.zeros(0).as_subclass(CudaLike),
                                        reduction=reduction)
        want = torch.nn.functional.cosine_embedding_loss(torch.zeros(0, 5), torch.zeros(0, 5),
                                                         torch.zeros(0), reduction=reduction)
        torch.testing.assert_close(loss.as_subclass(torch.Tensor), want, equal_nan=True)
        if grads:
            loss.sum().backward()
            assert x1.grad.shape == (0, 5)
    assert cuda.ids() == []


def test_from_the_public_function_to_the_launch_through_few_modules(cuda, monkeypatch):  # noqa: F811
    """At each launch, cek's modules on the call stack, from the public function down: at most
    six, none entered again after it was left (no climbing back up to a module a call passed)."""
    import traceback

    from cek import gpu

    paths, real = [], gpu.get_function

    def get_function(kernel, options=()):
        function = real(kernel, options)

        def traced(*args, **kwargs):
            modules = []
            for frame in traceback.extract_stack()[:-1]:
                name = frame.filename.replace("\\", "/").rpartition("/cek/")[2]
                if "/cek/" in frame.filename.replace("\\", "/") and name not in modules[-1:]:
                    modules.append(name)
            paths.append(modules)
            return function(*args, **kwargs)
        return traced

    monkeypatch.setattr(gpu, "get_function", get_function)
    monkeypatch.setattr(ct, "_plain_eager", lambda *tensors: True)
    x1, x2 = (torch.randn(8, 64).as_subclass(CudaLike).requires_grad_() for _ in "12")
    for _ in range(2):  # a signature's first step, checked in full; a later one
        ct.cosine_embedding_loss(x1, x2, torch.ones(8).as_subclass(CudaLike)).backward()
    a1, a2 = (cuda.array(np.random.rand(8, 64).astype(np.float32)) for _ in "12")
    F.cosine_embedding_loss_fused(a1, a2, cuda.array(np.ones(8, np.float32)))
    assert len(paths) == 8 and ["functional.py", "gpu.py"] in paths
    assert ["torch/__init__.py", "torch/_ops.py", "torch/_cuda.py", "gpu.py"] in paths
    for modules in paths:
        assert len(modules) <= 6 and len(set(modules)) == len(modules), modules


@pytest.mark.compile
def test_cek_plan_reports_each_launch_of_the_plan():
    """`cek plan --report GPU`: the static report's row of each launch, in the plan's order,
    with the plan's grid (the reduction's two levels: a block per slice, then one)."""
    args = ["plan", "--n-rows", "70000", "--n-dim", "8", "--no-grad", "--report", "h200"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    step = _plan(70000, 8, "f32", "mean", grads=False)
    assert [r["kernel_id"] for r in rows] == _ids(step.launches)
    assert [r["grid"] for r in rows] == [list(l.grid) for l in step.launches]
    assert [r["grid"][0] for r in rows[1:]] == [3, 1]  # 32768 losses a block, then their sum
    assert all(r["op"] == "forward" and r["arch"] == "sm_90" for r in rows)
