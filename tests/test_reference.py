"""cpu tier: the float64 reference against PyTorch's autograd and central finite differences."""

import numpy as np
import pytest

from cek import reference

torch = pytest.importorskip("torch")

MARGINS = [-0.5, 0.0, 0.5]


def _inputs(n=16, d=9, seed=0):
    rng = np.random.default_rng(seed)
    x1 = rng.standard_normal((n, d))
    x2 = rng.uniform(-1, 1, (n, 1)) * x1 + rng.standard_normal((n, d))
    x1[3] = 0.0  # a zero row: EPS keeps it finite
    y = np.array([(1.0, -1.0, 0.0, 2.0)[i % 4] for i in range(n)])
    dy = rng.uniform(0.5, 2.0, n)
    return x1, x2, y, dy


def _torch_loss_and_grads(x1, x2, y, dy, margin):
    t1 = torch.tensor(x1, requires_grad=True)
    t2 = torch.tensor(x2, requires_grad=True)
    loss = torch.nn.functional.cosine_embedding_loss(
        t1, t2, torch.tensor(y), margin=margin, reduction="none")
    loss.backward(torch.tensor(dy))
    return loss.detach().numpy(), t1.grad.numpy(), t2.grad.numpy()


@pytest.mark.parametrize("margin", MARGINS)
def test_forward_and_backward_match_torch_float64(margin):
    x1, x2, y, dy = _inputs()
    loss, g1, g2 = _torch_loss_and_grads(x1, x2, y, dy, margin)
    np.testing.assert_allclose(reference.forward(x1, x2, y, margin), loss, rtol=1e-12, atol=1e-14)
    dx1, dx2 = reference.backward(dy, x1, x2, y, margin)
    np.testing.assert_allclose(dx1, g1, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx2, g2, rtol=1e-10, atol=1e-12)


def test_labels_other_than_plus_minus_one_give_zero_loss_and_gradient():
    x1, x2, y, dy = _inputs()
    other = (y != 1) & (y != -1)
    assert other.any()
    assert np.all(reference.forward(x1, x2, y)[other] == 0)
    dx1, dx2 = reference.backward(dy, x1, x2, y)
    assert np.all(dx1[other] == 0) and np.all(dx2[other] == 0)


def test_differs_from_torch_only_at_c_equal_margin():
    # x2 = x1 gives c = 1 exactly; with margin 1 PyTorch's clamp_min passes the gradient, the
    # documented formula (c > margin) does not.
    x1 = np.array([[1.0, 2.0, 3.0]])
    y, dy = np.array([-1.0]), np.array([1.0])
    _, g1, _ = _torch_loss_and_grads(x1, x1.copy(), y, dy, 1.0)
    dx1, _ = reference.backward(dy, x1, x1.copy(), y, 1.0)
    assert np.all(dx1 == 0)
    assert np.all(np.isfinite(g1))  # torch: a gradient at the kink (tiny here, since c = 1)


@pytest.mark.parametrize("margin", MARGINS)
def test_backward_matches_central_finite_differences(margin):
    x1, x2, y, dy = _inputs(n=8, d=5, seed=1)
    x1[3] = 0.3  # finite differences of the zero row would step across the EPS kink
    h = 1e-6
    dx1, dx2 = reference.backward(dy, x1, x2, y, margin)
    for which, grad in ((0, dx1), (1, dx2)):
        num = np.zeros_like(grad)
        for idx in np.ndindex(grad.shape):
            plus, minus = [x1.copy(), x2.copy()], [x1.copy(), x2.copy()]
            plus[which][idx] += h
            minus[which][idx] -= h
            f = lambda a: np.dot(dy, reference.forward(a[0], a[1], y, margin))  # noqa: E731
            num[idx] = (f(plus) - f(minus)) / (2 * h)
        np.testing.assert_allclose(grad, num, rtol=1e-5, atol=1e-7)


def test_nan_propagates_to_loss_and_gradient():
    x1, x2, y, dy = _inputs(n=4)
    x1[0, 0] = np.nan  # y[0] == 1
    x1[1, 0] = np.nan  # y[1] == -1
    assert np.isnan(reference.forward(x1, x2, y)[:2]).all()
    dx1, dx2 = reference.backward(dy, x1, x2, y)
    assert np.isnan(dx1[:2]).all() and np.isnan(dx2[:2]).all()


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="expected x1, x2"):
        reference.forward(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros(2))
