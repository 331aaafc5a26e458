"""Error inputs, torch and cek.torch side by side, against what docs/torch.md says of them.

PyTorch's OpInfo for nn.functional.cosine_embedding_loss (torch 2.13,
torch/testing/_internal/common_methods_invocations.py) has sample inputs and no
error_inputs_func; torch's error inputs for this loss are test_nn.py's two
(test_cosine_embedding_loss_error_on_diff_shapes and ..._error_on_nonexpandable_shapes, which
tests/test_torch_suite.py also runs with their patterns) and the checks of ATen's
cosine_embedding_loss (Loss.cpp) and of the broadcasting in it. Each is here, with every other
error the doc names: bad margins and reductions, devices, complex inputs. For each, torch's
exception and cek's are checked against the doc's claim:
- "torch's": cek raises torch's exception type or a subclass (for shapes, cek.torch.ShapeError:
  a RuntimeError and a ValueError), and for shapes a message that starts with torch's own;
- an exception class: the documented difference, cek raising that class where torch raises the
  type the doc names (or nothing, where torch takes the input).
"""

import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import cek.torch as ct  # noqa: E402

F = torch.nn.functional
DOC = Path(__file__).resolve().parents[1] / "docs" / "torch.md"

# docs/torch.md's claims about errors, as written there (whitespace aside): each test below
# checks one of them, and a doc that stops making a claim fails test_the_doc_makes_these_claims.
CLAIMS = {
    "shapes": "Shapes the loss does not take raise `cek.torch.ShapeError`, which is both a "
              "`ValueError` (cek's type for a bad value) and a `RuntimeError` (torch's type for "
              "these), with messages that start with torch's own for the same shapes",
    "widths of one": "widths of which one is 1, which torch takes, have cek's message alone",
    "reduction": "A bad `reduction` is a ValueError in both",
    "devices and complex": "Inputs on different devices and complex inputs raise `TypeError`, "
                           "where torch raises `RuntimeError` and `NotImplementedError`",
    "margin": "what torch refuses raises torch's exception type",
    "margin device": "A tensor margin must be on the CPU (a TypeError otherwise)",
    "target device": "A 0-d target on the CPU with (D,) inputs on another device is a TypeError",
}


def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


def _x(n=4, d=3, **kw):
    return _t(n, d, **kw)


# (name, (input1, input2, target), keyword arguments, the claim, what cek raises per the doc,
# what torch raises per the doc: None where it takes the input).
SHAPE = ("shapes", "torch's", RuntimeError)
ERROR_INPUTS = [
    # test_nn.py's error inputs
    ("diff shapes (test_nn)", (_t(0, 0, dtype=torch.double), _t(0, dtype=torch.double),
                               _t(0, dtype=torch.int)), {}, *SHAPE),
    ("nonexpandable shapes (test_nn)", (_t(1, 5, dtype=torch.double), _t(1, 6, dtype=torch.double),
                                        _t(1, dtype=torch.int)), {}, *SHAPE),
    # ATen's checks of the dimensions
    ("2-D target", (_x(), _x(), _t(4, 1)), {}, *SHAPE),
    ("3-D target", (_x(), _x(), _t(4, 1, 1)), {}, *SHAPE),
    ("1-D target, 1-D inputs", (_t(3), _t(3), _t(3)), {}, *SHAPE),
    ("1-D target, 3-D inputs", (_t(4, 3, 1), _t(4, 3, 1), _t(4)), {}, *SHAPE),
    ("1-D target, 2-D and 1-D inputs", (_x(), _t(3), _t(4)), {}, *SHAPE),
    ("0-D target, 2-D inputs", (_x(2, 5), _x(2, 5), _t()), {}, *SHAPE),
    ("0-D target, 1-D and 2-D inputs", (_t(5), _x(2, 5), _t()), {}, *SHAPE),
    # broadcasting: rows of different counts, widths
    ("rows of input2", (_x(4), _x(3), _t(4)), {}, *SHAPE),
    ("rows of input1", (_x(2), _x(4), _t(4)), {}, *SHAPE),
    ("rows of the target", (_x(4), _x(4), _t(3)), {}, *SHAPE),
    ("rows of all three", (_x(2), _x(4), _t(5)), {}, *SHAPE),
    ("one row against the target", (_x(1), _x(4), _t(3)), {}, *SHAPE),
    ("no rows against the target", (_x(0), _x(1), _t(4)), {}, *SHAPE),
    ("widths", (_x(4, 3), _x(4, 5), _t(4)), {}, *SHAPE),
    ("widths of (D,) inputs", (_t(3), _t(4), _t()), {}, *SHAPE),
    ("widths and rows", (_x(4, 3), _x(3, 5), _t(4)), {}, *SHAPE),
    ("rows, and a width of 1", (_x(4, 1), _x(3, 5), _t(4)), {}, *SHAPE),
    ("a width of 1", (_x(4, 3), _x(4, 1), _t(4)), {}, "widths of one", ct.ShapeError, None),
    ("a width of 1 in input1", (_x(4, 1), _x(4, 3), _t(4)), {}, "widths of one", ct.ShapeError,
     None),
    # the reduction and the margin
    ("reduction 'avg'", (_x(), _x(), _t(4)), {"reduction": "avg"}, "reduction", "torch's",
     ValueError),
    ("reduction None", (_x(), _x(), _t(4)), {"reduction": None}, "reduction", "torch's",
     ValueError),
    ("margin str", (_x(), _x(), _t(4)), {"margin": "0.5"}, "margin", "torch's", TypeError),
    ("margin None", (_x(), _x(), _t(4)), {"margin": None}, "margin", "torch's", TypeError),
    ("margin list", (_x(), _x(), _t(4)), {"margin": [0.5]}, "margin", "torch's", TypeError),
    ("margin complex", (_x(), _x(), _t(4)), {"margin": 1j}, "margin", "torch's", TypeError),
    ("margin 1-d tensor", (_x(), _x(), _t(4)), {"margin": torch.tensor([0.5])}, "margin",
     "torch's", TypeError),
    ("margin that requires grad", (_x(), _x(), _t(4)),
     {"margin": torch.tensor(0.5, requires_grad=True)}, "margin", "torch's", TypeError),
    ("margin beyond float", (_x(), _x(), _t(4)), {"margin": 10**400}, "margin", "torch's",
     OverflowError),
    ("margin on meta", (_x(), _x(), _t(4)), {"margin": torch.tensor(0.5, device="meta")},
     "margin device", TypeError, RuntimeError),
    # devices and complex inputs
    ("input2 on meta", (_x(), _x(device="meta"), _t(4)), {}, "devices and complex", TypeError,
     RuntimeError),
    ("target on meta", (_x(), _x(), _t(4, device="meta")), {}, "devices and complex", TypeError,
     RuntimeError),
    ("complex inputs", (_x(dtype=torch.cfloat), _x(dtype=torch.cfloat), _t(4)), {},
     "devices and complex", TypeError, NotImplementedError),
    ("0-d CPU target, (D,) inputs on meta", (_t(3, device="meta"), _t(3, device="meta"), _t()),
     {}, "target device", TypeError, None),
]
IDS = [e[0] for e in ERROR_INPUTS]


def _raised(call):
    """The exception call() raises, or None."""
    try:
        call()
    except Exception as error:  # noqa: BLE001  (any exception is the result here)
        return error
    return None


def _calls(inputs, kwargs):
    """(torch's call, cek's call) of the functional form, then of the module, each module built
    and called in one go (cek refuses a margin or reduction at construction, torch at the first
    call)."""
    return [(lambda: F.cosine_embedding_loss(*inputs, **kwargs),
             lambda: ct.cosine_embedding_loss(*inputs, **kwargs)),
            (lambda: torch.nn.CosineEmbeddingLoss(**kwargs)(*inputs),
             lambda: ct.CosineEmbeddingLoss(**kwargs)(*inputs))]


def _message_start(error):
    """torch's message for the shapes, less its closing full stop."""
    return str(error).removesuffix(".")


def test_the_doc_makes_these_claims():
    text = " ".join(DOC.read_text().split())
    for name, claim in CLAIMS.items():
        assert claim in text, name
    assert sorted({e[3] for e in ERROR_INPUTS}) == sorted(CLAIMS)


@pytest.mark.parametrize("name, inputs, kwargs, claim, ours, theirs", ERROR_INPUTS, ids=IDS)
def test_error_input_side_by_side(name, inputs, kwargs, claim, ours, theirs):
    for torch_call, cek_call in _calls(inputs, kwargs):
        torch_error, cek_error = _raised(torch_call), _raised(cek_call)
        if theirs is None:
            assert torch_error is None, f"torch now raises {torch_error!r}"
        else:
            assert type(torch_error) is theirs, f"torch raised {torch_error!r}"
        if ours == "torch's":
            assert isinstance(cek_error, type(torch_error)), f"cek raised {cek_error!r}"
        else:
            assert isinstance(cek_error, ours), f"cek raised {cek_error!r}"
        if claim == "shapes":
            assert isinstance(cek_error, ct.ShapeError) and isinstance(cek_error, ValueError)
            assert str(cek_error).startswith(_message_start(torch_error)), (
                f"cek: {cek_error}\ntorch: {torch_error}")


def test_shape_messages_start_as_torchs_whatever_the_counts():
    """Rows of every count from 0 to 3 for input1, input2 and the target (N, 3): wherever torch
    refuses them, cek's message starts with torch's; wherever torch takes them, so does cek."""
    for n1, n2, nt in np.ndindex(4, 4, 4):
        inputs = (_x(n1), _x(n2), _t(nt))
        torch_error = _raised(lambda: F.cosine_embedding_loss(*inputs))
        cek_error = _raised(lambda: ct.cosine_embedding_loss(*inputs))
        if torch_error is None:
            assert cek_error is None, ((n1, n2, nt), cek_error)
            continue
        assert isinstance(cek_error, ct.ShapeError), ((n1, n2, nt), cek_error)
        assert str(cek_error).startswith(_message_start(torch_error)), (
            f"{(n1, n2, nt)}: cek: {cek_error}\ntorch: {torch_error}")


def test_a_message_names_the_shapes():
    """Past torch's words, cek's message names every shape in play."""
    error = _raised(lambda: ct.cosine_embedding_loss(_x(4), _x(3), _t(5)))
    assert re.search(r"input1 \(4, 3\), input2 \(3, 3\) and target \(5,\)", str(error)), error
    error = _raised(lambda: ct.cosine_embedding_loss(_x(4, 3), _x(4, 5), _t(4)))
    assert "(4, 3)" in str(error) and "(4, 5)" in str(error), error
