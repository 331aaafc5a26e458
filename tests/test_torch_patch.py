"""cek.torch.patch(): cek behind torch's own names, torch.nn.functional.cosine_embedding_loss and
torch.nn.CosineEmbeddingLoss, and torch's function put back as it was.

PyTorch's own inputs for this loss (tests/test_torch_suite.py rebuilds them: OpInfo samples,
ModuleInfo inputs, test_nn.py's error inputs; tests/test_torch_error_inputs.py adds every
error the loss can raise) run through the patched names and give torch's results, gradients
and errors; a call cek refuses is run by torch's own function, so its error is torch's to the
letter, and where torch takes what cek refuses, the result is torch's.
"""

import itertools
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import cek.torch as ct  # noqa: E402
import test_torch_error_inputs as errors  # noqa: E402
import test_torch_suite as suite  # noqa: E402
from cek import gpu  # noqa: E402
from cek.torch import _patch  # noqa: E402

TORCH_FUNCTION = F.cosine_embedding_loss  # as imported, before any patch


@pytest.fixture
def served(monkeypatch):
    """Patched for the test (and unpatched after it, whatever happens): the calls cek.torch's
    function served, in a list."""
    calls = []
    cek_function = ct.cosine_embedding_loss

    def spy(*args, **kwargs):
        calls.append(args)
        return cek_function(*args, **kwargs)

    monkeypatch.setattr(ct, "cosine_embedding_loss", spy)
    with ct.patched():
        yield calls
    assert F.cosine_embedding_loss is TORCH_FUNCTION


def test_patch_twice_then_unpatch_once_puts_back_torchs_function():
    assert F.cosine_embedding_loss is TORCH_FUNCTION
    try:
        ct.patch()
        first = F.cosine_embedding_loss
        ct.patch()
        assert F.cosine_embedding_loss is first is not TORCH_FUNCTION
    finally:
        ct.unpatch()
    assert F.cosine_embedding_loss is TORCH_FUNCTION  # the very object
    ct.unpatch()  # not patched: nothing happens
    assert F.cosine_embedding_loss is TORCH_FUNCTION


def test_patched_leaves_things_as_it_found_them():
    with ct.patched():
        assert F.cosine_embedding_loss is not TORCH_FUNCTION
        with ct.patched():
            pass
        assert F.cosine_embedding_loss is not TORCH_FUNCTION  # the outer block's still
    assert F.cosine_embedding_loss is TORCH_FUNCTION
    with pytest.raises(KeyError):
        with ct.patched():
            raise KeyError("a failing block")
    assert F.cosine_embedding_loss is TORCH_FUNCTION
    try:
        ct.patch()
        with ct.patched():
            pass
        assert F.cosine_embedding_loss is not TORCH_FUNCTION  # patch()'s still
    finally:
        ct.unpatch()


def _step(loss_fn, x1, x2, target, kwargs):
    """(loss, dx1, dx2) of a weighted sum of the loss, on copies of the inputs."""
    a1, a2 = (t.clone().requires_grad_() for t in (x1, x2))
    t = target.clone().requires_grad_()  # as OpInfo: the target too
    loss = loss_fn(a1, a2, t, **kwargs)
    weights = torch.linspace(0.5, 2.0, loss.numel(), dtype=loss.dtype, device=loss.device)
    (loss.flatten() * weights).sum().backward()
    return loss.detach(), a1.grad, a2.grad


def _same(ours, theirs, dtype):
    rtol, atol = suite.TOLERANCES[dtype]
    assert ours[0].dtype == theirs[0].dtype and ours[0].shape == theirs[0].shape
    for got, want in zip(ours, theirs):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", suite.DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_opinfo_samples_through_the_patched_function(served, device, dtype):
    samples = [s for seed in (0, 1) for s in suite._opinfo_samples(device, dtype, seed)]
    for x1, x2, target, kwargs in samples:
        theirs = _step(TORCH_FUNCTION, x1, x2, target, kwargs)
        _same(_step(F.cosine_embedding_loss, x1, x2, target, kwargs), theirs, dtype)
    assert len(served) == len(samples)  # each served by cek


@pytest.mark.parametrize("device", suite.DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_module_inputs_through_the_patched_module(served, device, dtype):
    samples = list(suite._module_samples(device, dtype, seed=2))
    for x1, x2, target, kwargs in samples:
        module = torch.nn.CosineEmbeddingLoss(**kwargs)
        ours = _step(lambda *a: module(*a), x1, x2, target, {})
        theirs = _unpatched(lambda: _step(lambda *a: module(*a), x1, x2, target, {}))
        _same(ours, theirs, dtype)
    assert len(served) == len(samples)


@pytest.mark.parametrize("device", suite.DEVICES)
def test_mixed_dtypes_through_the_patched_function(served, device):
    """test_nn.py's test_cosine_embedding_loss_with_diff_type: every real dtype of input1,
    input2 and target gives torch's result dtype, and the float64 result to 1e-3."""
    input1 = torch.tensor([[2, 3, 4], [6, 2, 4]], dtype=torch.double, device=device)
    input2 = torch.tensor([[2, 3, 5], [3, 2, 1]], dtype=torch.double, device=device)
    target = torch.tensor([1, -1], dtype=torch.int, device=device)
    expected = TORCH_FUNCTION(input1, input2, target)
    for dt1, dt2, dt3 in itertools.product(suite.REAL_DTYPES, suite.REAL_DTYPES,
                                           suite.REAL_DTYPES[1:]):
        a, b, t = input1.to(dt1), input2.to(dt2), target.to(dt3)
        ours = F.cosine_embedding_loss(a, b, t)
        assert ours.dtype == TORCH_FUNCTION(a, b, t).dtype, (dt1, dt2, dt3)
        assert abs(ours.item() - expected.item()) <= 1e-3, (dt1, dt2, dt3)
    assert len(served) == len(suite.REAL_DTYPES) ** 2 * (len(suite.REAL_DTYPES) - 1)


@pytest.mark.parametrize("device", suite.DEVICES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_no_batch_dim_through_the_patched_module(served, device, reduction):
    """common_nn.py's CosineEmbeddingLoss_no_batch_dim entries: a (9,) row against torch's
    module on the row batched as (1, 9), with gradcheck and gradgradcheck."""
    gen = torch.Generator().manual_seed(3)
    x1, x2 = (torch.randn(9, dtype=torch.double, generator=gen).to(device).requires_grad_()
              for _ in range(2))
    target = torch.tensor(1, dtype=torch.double, device=device)
    module = torch.nn.CosineEmbeddingLoss(reduction=reduction)
    ours = module(x1, x2, target)
    batched = _unpatched(lambda: module(x1.unsqueeze(0), x2.unsqueeze(0), target.unsqueeze(0)))
    theirs = batched.squeeze(0) if reduction == "none" else batched
    assert ours.shape == theirs.shape == () and ours.dtype == torch.double
    rtol, atol = suite.TOLERANCES[torch.double]
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol)
    assert torch.autograd.gradcheck(lambda a, b: module(a, b, target), (x1, x2))
    assert torch.autograd.gradgradcheck(lambda a, b: module(a, b, target), (x1, x2))
    assert len(served) >= 1


def _outcome(call):
    """(the exception's type and message, None) or (None, the result)."""
    try:
        return None, call()
    except Exception as error:  # noqa: BLE001 - the exception is the outcome
        return (type(error), str(error)), None


# test_nn.py's error inputs and ATen's checks (test_torch_suite.py), and every error the loss
# raises (test_torch_error_inputs.py), each with its keyword arguments
ERROR_INPUTS = ([(f"suite: {name}", make, {}) for name, make, _ in suite.ERROR_INPUTS]
                + [(name, lambda device, i=inputs: i, kwargs)
                   for name, inputs, kwargs, *_ in errors.ERROR_INPUTS])


@pytest.mark.parametrize("name, make, kwargs", ERROR_INPUTS, ids=[e[0] for e in ERROR_INPUTS])
def test_error_inputs_give_torchs_error_or_result(served, name, make, kwargs):
    inputs = make("cpu")
    for patched, original in (
            (lambda: F.cosine_embedding_loss(*inputs, **kwargs),
             lambda: TORCH_FUNCTION(*inputs, **kwargs)),
            (lambda: torch.nn.CosineEmbeddingLoss(**kwargs)(*inputs),
             lambda: _unpatched(lambda: torch.nn.CosineEmbeddingLoss(**kwargs)(*inputs)))):
        (ours, ours_value), (theirs, theirs_value) = _outcome(patched), _outcome(original)
        assert ours == theirs  # the same type and message, or both none
        if theirs is None:  # torch takes it (cek does not): torch's own result
            torch.testing.assert_close(ours_value, theirs_value, rtol=0, atol=0)


def _unpatched(call):
    ct.unpatch()
    try:
        return call()
    finally:
        ct.patch()


def test_what_cek_serves_and_what_it_hands_to_torch(served):
    x1, x2, y = torch.randn(4, 3), torch.randn(4, 3), torch.tensor([1, -1, 1, -1])
    F.cosine_embedding_loss(x1, x2, y)
    assert len(served) == 1
    # widths of which one is 1: cek refuses them, torch broadcasts: torch's result, computed once
    # by cek's attempt (refused) and once by torch
    wide = torch.randn(4, 1)
    torch.testing.assert_close(F.cosine_embedding_loss(x1, wide, y),
                               TORCH_FUNCTION(x1, wide, y), rtol=0, atol=0)
    assert len(served) == 2

    class Logged(torch.Tensor):  # a subclass that overrides torch functions: torch's to call
        seen = []

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            cls.seen.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    a1 = x1.as_subclass(Logged)
    F.cosine_embedding_loss(a1, x2, y)
    # torch's function handed the call to the subclass with the name's object, cek's
    assert Logged.seen[0] is F.cosine_embedding_loss
    # a mode (torch.device's): torch's function hands it back, and cek serves the plain call
    want = TORCH_FUNCTION(x1, x2, y)
    count = len(served)
    with torch.device("cpu"):
        torch.testing.assert_close(F.cosine_embedding_loss(x1, x2, y), want)
    assert len(served) == count + 1
    # meta tensors: torch's own function
    meta = F.cosine_embedding_loss(x1.to("meta"), x2.to("meta"), y.to("meta"))
    assert meta.device.type == "meta" and len(served) == count + 1


def test_a_name_bound_before_the_patch_is_not_reached(served):
    from torch.nn.functional import cosine_embedding_loss  # bound inside the patch: cek's

    assert cosine_embedding_loss is _patch.cosine_embedding_loss
    assert TORCH_FUNCTION is not cosine_embedding_loss  # bound before (this module's): torch's


def test_compiled_patched_call_has_no_graph_break(served):
    """torch.compile(fullgraph=True) of a step through the patched module and function: one
    graph, which calls cek's op, and the eager step's values."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    module = torch.nn.CosineEmbeddingLoss(margin=0.1)

    def step(a, b, y):
        return module(a, b, y) + F.cosine_embedding_loss(a, b, y, reduction="sum")

    gen = torch.Generator().manual_seed(4)
    x1, x2 = (torch.randn(6, 5, generator=gen, requires_grad=True) for _ in range(2))
    y = torch.tensor([1, -1, 1, 1, -1, -1])
    loss = torch.compile(step, fullgraph=True, backend=backend)(x1, x2, y)
    assert len(graphs) == 1
    code = graphs[0].code
    assert code.count("torch.ops.cek.cosine_embedding_loss") == 2, code
    loss.backward()
    a1, a2 = (t.detach().clone().requires_grad_() for t in (x1, x2))
    want = (torch.nn.CosineEmbeddingLoss(margin=0.1)(a1, a2, y)
            + TORCH_FUNCTION(a1, a2, y, reduction="sum"))
    want.backward()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(x1.grad, a1.grad)
    torch.testing.assert_close(x2.grad, a2.grad)


def test_patching_before_torch_compile_is_imported_still_traces_cek():
    """torch.compile's table of torch's functions is built when torch._dynamo is first
    imported: a patch made before that must not land in it (the call would go into the graph
    untraced, not as cek's op)."""
    code = textwrap.dedent("""
        import sys
        import torch
        import cek.torch
        assert "torch._dynamo" not in sys.modules
        cek.torch.patch()
        graphs = []
        def backend(gm, example_inputs):
            graphs.append(gm.code)
            return gm.forward
        step = lambda a, b, y: torch.nn.CosineEmbeddingLoss()(a, b, y)
        x1, x2 = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
        torch.compile(step, fullgraph=True, backend=backend)(x1, x2, torch.ones(3)).backward()
        print(graphs[0].count("torch.ops.cek.cosine_embedding_loss"))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]


def test_compiled_with_aot_eager_has_no_graph_break(served):
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    x1, x2 = (torch.randn(3, 4, requires_grad=True) for _ in range(2))
    y = torch.tensor([1, -1, 1])
    fn = torch.compile(lambda a, b, t: torch.nn.CosineEmbeddingLoss()(a, b, t), fullgraph=True,
                       backend=counter)
    fn(x1, x2, y).backward()
    assert counter.frame_count == 1
    assert x1.grad is not None and x2.grad is not None


@pytest.mark.parametrize("error", [
    lambda: gpu.NoDeviceError("no CUDA device found"),
    lambda: gpu.CaptureError("warm up first"),
    lambda: torch.OutOfMemoryError("out of memory"),
])
def test_cek_failing_where_it_runs_is_not_hidden_behind_torch(served, monkeypatch, error):
    """No CuPy or device, a first launch under CUDA-graph capture, the memory exhausted: cek's
    error, raised. Handed to torch's function, a caller who patched cek in would run (or
    capture) torch's loss without a word."""
    def failing(*args, **kwargs):
        raise error()

    monkeypatch.setattr(ct, "cosine_embedding_loss", failing)
    with pytest.raises(type(error())):
        F.cosine_embedding_loss(torch.randn(4, 3), torch.randn(4, 3), torch.ones(4))
