"""docs/torch.md's "Deliberate differences from torch", each run against torch: every bullet of
the list has a test here that shows torch doing one thing and cek.torch the other, so a bullet
whose difference is gone (torch changed, or cek did) fails, and so does a bullet with no test.
Everything else cek.torch takes as torch does (tests/test_torch_parity.py,
tests/test_torch_suite.py, tests/test_torch_rules.py)."""

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import cek.torch as ct  # noqa: E402
from cek import cosine_embedding_loss_split as split  # noqa: E402
from test_torch_cuda_glue import CudaLike  # noqa: E402

F = torch.nn.functional
DOC = Path(__file__).resolve().parents[1] / "docs" / "torch.md"


def _listed():
    """Each bullet of the list by its opening words: its first line, up to a full stop or a
    colon."""
    section = DOC.read_text().split("## Deliberate differences from torch\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    return [re.split(r"[.:]", item, maxsplit=1)[0].strip()
            for item in re.findall(r"^- (.+)", section, re.M)]


def _grads(loss_fn, x1, x2, target, *args, **kwargs):
    a1, a2 = (x.detach().clone().requires_grad_() for x in (x1, x2))
    loss = loss_fn(a1, a2, target, *args, **kwargs)
    loss.sum().backward()
    return loss.detach(), a1.grad, a2.grad


def no_gradient_at_the_margin():
    """c = 0 exactly (orthogonal rows) at margin 0, label -1: the loss is 0 for both; torch's
    clamp_min passes the gradient of c, cek's gradient is 0."""
    x1, x2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    target = torch.tensor([-1.0])
    theirs, ours = (_grads(fn, x1, x2, target, 0.0) for fn in (F.cosine_embedding_loss,
                                                                ct.cosine_embedding_loss))
    assert theirs[0] == ours[0] == 0
    assert theirs[1].abs().sum() > 0 and ours[1].abs().sum() == 0


def float16_rows():
    """Identical N(0,1) rows of 768 float16 values: sq1 * sq2 overflows float16 in torch, whose
    loss is 1 (a cosine of 0); cek's is about 0, as for any identical rows."""
    row = torch.randn(1, 768, generator=torch.Generator().manual_seed(0)).half()
    target = torch.ones(1)
    assert F.cosine_embedding_loss(row, row.clone(), target) == 1
    assert abs(ct.cosine_embedding_loss(row, row.clone(), target).item()) < 1e-3


def integer_inputs():
    """Rows of 2**32: torch's integer products wrap to 0 (loss 1 for identical rows), cek's
    float ones do not. And an integer x1 changed in place before the backward: torch's
    backward raises, cek's reads its converted copy."""
    big = torch.full((1, 2), 2 ** 32)
    target = torch.tensor([1])
    assert F.cosine_embedding_loss(big, big, target) == 1
    assert abs(ct.cosine_embedding_loss(big, big, target).item()) < 1e-6
    for loss_fn, raises in ((F.cosine_embedding_loss, True), (ct.cosine_embedding_loss, False)):
        x1 = torch.tensor([[1, 2, 3], [4, 5, 6]])
        x2 = torch.randn(2, 3, requires_grad=True)
        loss = loss_fn(x1, x2, torch.tensor([1, -1]), -1.0)
        x1.add_(1)
        if raises:
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loss.backward()
        else:
            loss.backward()
            want = _grads(ct.cosine_embedding_loss, torch.tensor([[1, 2, 3], [4, 5, 6]]).float(),
                          x2, torch.tensor([1, -1]), -1.0)[2]
            torch.testing.assert_close(x2.grad, want)


def different_widths():
    """(N, D) against (N, 1): torch broadcasts the width, cek refuses."""
    x1, x2 = torch.randn(2, 5), torch.randn(2, 1)
    target = torch.tensor([1.0, -1.0])
    assert F.cosine_embedding_loss(x1, x2, target, reduction="none").shape == (2,)
    with pytest.raises(ValueError, match="width D"):
        ct.cosine_embedding_loss(x1, x2, target)


def long_rows():
    """A row of 2**22 + 1 float32 elements (wider than the split takes): torch computes it,
    cek's CUDA path (a tensor that claims CUDA: the check runs before any kernel) refuses it."""
    d = split.max_n_dim("f32") + 1
    x = torch.ones(1, d)
    target = torch.ones(1)
    assert F.cosine_embedding_loss(x, x, target).abs() < 1e-6
    with pytest.raises(ValueError, match=str(d)):
        ct.cosine_embedding_loss(x.as_subclass(CudaLike), x.as_subclass(CudaLike), target)


def tensor_margin_device():
    """torch reads a tensor margin's value with .item() (on a CUDA tensor, a host sync each
    call): on a meta tensor, the one device here besides the CPU, that item() is what fails.
    cek refuses a margin off the CPU with a TypeError before reading it."""
    x1, x2 = torch.randn(2, 3), torch.randn(2, 3)
    target = torch.tensor([1.0, -1.0])
    with pytest.raises(RuntimeError, match=r"item\(\)"):
        F.cosine_embedding_loss(x1, x2, target, torch.tensor(0.5, device="meta"))
    with pytest.raises(TypeError, match="margin must be on the CPU"):
        ct.cosine_embedding_loss(x1, x2, target, torch.tensor(0.5, device="meta"))
    if torch.cuda.is_available():  # the gpu tier's version of the same
        margin = torch.tensor(0.5, device="cuda")
        F.cosine_embedding_loss(x1.cuda(), x2.cuda(), target.cuda(), margin)
        with pytest.raises(TypeError, match="margin must be on the CPU"):
            ct.cosine_embedding_loss(x1.cuda(), x2.cuda(), target.cuda(), margin)


def cpu_target_with_device_inputs():
    """(D,) inputs on meta (the device here besides the CPU) with a 0-d CPU target: torch takes
    the CPU scalar, cek refuses it."""
    x = torch.randn(3, device="meta")
    assert F.cosine_embedding_loss(x, x, torch.tensor(1.0)).device.type == "meta"
    with pytest.raises(TypeError, match="target is on cpu"):
        ct.cosine_embedding_loss(x, x, torch.tensor(1.0))


def exception_types():
    """A ShapeError is a RuntimeError, as torch's error for the shape; a bad reduction is a
    ValueError in both; inputs on two devices and complex inputs: TypeError in cek,
    RuntimeError and NotImplementedError in torch."""
    x = torch.randn(2, 3)
    target = torch.tensor([1.0, -1.0])
    cases = [((x, x[:1], target[:1].expand(3)), {}, RuntimeError, ct.ShapeError),
             ((x, x, target), {"reduction": "avg"}, ValueError, ValueError),
             ((x, x.to("meta"), target), {}, RuntimeError, TypeError),
             ((x.cfloat(), x.cfloat(), target), {}, NotImplementedError, TypeError)]
    for args, kwargs, theirs, ours in cases:
        with pytest.raises(theirs):
            F.cosine_embedding_loss(*args, **kwargs)
        with pytest.raises(ours):
            ct.cosine_embedding_loss(*args, **kwargs)
    assert issubclass(ct.ShapeError, RuntimeError) and issubclass(ct.ShapeError, ValueError)


# Each bullet's opening words (its first line, up to a full stop or colon), and the test that
# shows its difference against torch.
DIFFERENCES = {
    "No gradient at `c == margin` exactly for label −1 (torch passes one through `clamp_min`)":
        no_gradient_at_the_margin,
    "float16 rows that overflow or underflow in torch's half-precision `sq1 * sq2` give finite,":
        float16_rows,
    "Integer and bool inputs are converted to the result dtype first; torch forms their products":
        integer_inputs,
    "Inputs of different widths D (one of them 1) are a ValueError": different_widths,
    "Rows wider than the kernels take are a ValueError on CUDA tensors":
        long_rows,
    "A tensor margin must be on the CPU (a TypeError otherwise)": tensor_margin_device,
    "A 0-d target on the CPU with (D,) inputs on another device is a TypeError":
        cpu_target_with_device_inputs,
    "Exceptions": exception_types,
}


def test_every_listed_difference_has_a_test():
    assert _listed() == list(DIFFERENCES)


@pytest.mark.parametrize("show", list(DIFFERENCES.values()), ids=lambda f: f.__name__)
def test_the_listed_difference_is_real(show):
    show()
