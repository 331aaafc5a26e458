"""What cek.torch works out once per signature of its tensors (dtypes, shapes, devices, torch's
default dtype) and finds on the next call: the checks on the tensors and what they decide
(promotion, broadcasting). A signature seen before still checks the values that can change
(margin, reduction); a new one is checked in full, with the errors of a first call."""

import pytest

torch = pytest.importorskip("torch")
import cek.torch as ct  # noqa: E402

F = torch.nn.functional


@pytest.fixture(autouse=True)
def fresh_plans(monkeypatch):
    monkeypatch.setattr(ct, "_plans", {})


def _inputs(n=4, d=6, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x1, x2 = (torch.randn(n, d, generator=g).to(dtype) for _ in range(2))
    return x1, x2, torch.tensor([1.0, -1.0] * (n // 2))


def test_a_seen_signature_still_checks_margin_and_reduction():
    x1, x2, y = _inputs()
    ct.cosine_embedding_loss(x1, x2, y, 0.1)
    assert len(ct._plans) == 1
    with pytest.raises(TypeError, match="margin must be a float, got str"):
        ct.cosine_embedding_loss(x1, x2, y, "0.1")
    with pytest.raises(TypeError, match="shape \\(1,\\)"):
        ct.cosine_embedding_loss(x1, x2, y, torch.tensor([0.1]))
    with pytest.raises(ValueError, match="reduction must be one of"):
        ct.cosine_embedding_loss(x1, x2, y, 0.1, reduction="avg")
    got = ct.cosine_embedding_loss(x1, x2, y, margin=-0.5, reduction="none")
    torch.testing.assert_close(got, F.cosine_embedding_loss(x1, x2, y, -0.5, reduction="none"))
    assert len(ct._plans) == 1


@pytest.mark.parametrize("change, error, text", [
    (lambda x1, x2, y: (x1, x2[:, :5], y), ct.ShapeError, "width D of input1"),
    (lambda x1, x2, y: (x1, x2[:3], y), ct.ShapeError, "do not broadcast"),
    (lambda x1, x2, y: (x1, x2, y[:, None]), ct.ShapeError, "multi-target not supported"),
    (lambda x1, x2, y: (x1, x2.to(torch.complex64), y), TypeError, "input2 must have a real"),
    (lambda x1, x2, y: (x1, x2.to("meta"), y), TypeError, "input2 is on meta"),
])
def test_a_new_signature_is_checked_in_full(change, error, text):
    x1, x2, y = _inputs()
    ct.cosine_embedding_loss(x1, x2, y)
    with pytest.raises(error, match=text):
        ct.cosine_embedding_loss(*change(x1, x2, y))
    assert len(ct._plans) == 1  # a signature that failed its checks is not kept


def test_each_signature_gets_its_own_promotion_and_broadcasting():
    x1, x2, y = _inputs()
    cases = [(x1, x2, y), (x1, x2.double(), y), (x1[:1], x2, y), (x1, x2, y[:1]),
             ((4 * x1).round().to(torch.int64), x2, y.to(torch.int64)), (x1, x2, y)]
    for a1, a2, target in cases:
        got = ct.cosine_embedding_loss(a1, a2, target, 0.1, reduction="none")
        want = F.cosine_embedding_loss(a1, a2, target, 0.1, reduction="none")
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want)
    assert len(ct._plans) == 5


def test_the_default_dtype_is_part_of_the_signature():
    """Integer inputs take torch's default dtype: the same tensors under another default are
    another signature, with the other result dtype."""
    x1, x2 = (torch.arange(12).reshape(2, 6) + k for k in (0, 3))
    y = torch.tensor([1, -1])
    assert ct.cosine_embedding_loss(x1, x2, y).dtype == torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = ct.cosine_embedding_loss(x1, x2, y)
        assert got.dtype == F.cosine_embedding_loss(x1, x2, y).dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_compiled_code_does_not_guard_on_the_memo():
    """Under torch.compile the checks are traced (they become the graph's guards): eager calls
    of new signatures in between change the memo and must not recompile the compiled step."""
    import torch._dynamo.testing

    torch._dynamo.reset()
    x1, x2, y = _inputs()
    x1.requires_grad_(), x2.requires_grad_()
    counter = torch._dynamo.testing.CompileCounter()
    step = torch.compile(lambda a, b, t: ct.cosine_embedding_loss(a, b, t, 0.1),
                         fullgraph=True, backend=counter)
    for a1, a2, target in ((x1[:2], x2[:2], y[:2]), (x1.double(), x2, y)):
        step(x1, x2, y).backward()
        ct.cosine_embedding_loss(a1, a2, target)
    step(x1, x2, y).backward()
    assert counter.frame_count == 1 and len(ct._plans) == 2
