"""The backward kernel's documented contract, field by field: CosineEmbeddingLossBackward never
changes (a new need gets a kernel of its own name).

Documented: name, id (fn name + dtype + const values joined by "__"), block_size, kernel_source,
entry_point_source, source (kernel_source + "\\n\\n" + entry_point_source), entry_point_name()
("{name}_entry_point"), the launch tuple (*mut f32 x 6, i32, i32, f32) = (dy, x1, x2, y, dx1,
dx2, n_rows, n_dim, margin), grid [n_rows, 1, 1] and BLOCK_SIZE = next_power_of_two(n_dim).
"""

import re

import numpy as np
import pytest

import cek
from cek import check, dtypes, emulate
from cek.kernel import next_power_of_two
from cek.sources import load_kernel_source

Backward = cek.CosineEmbeddingLossBackward
NAMES = ["dy", "x1", "x2", "y", "dx1", "dx2", "n_rows", "n_dim", "margin"]
# dy and the gradients in the element type, the labels and margin in the accumulation type: in
# float32, the documented (*mut f32 x 6, i32, i32, f32).
C_TYPES = {
    "f32": ["float*"] * 6 + ["int", "int", "float"],
    "f64": ["double*"] * 6 + ["int", "int", "double"],
    "f16": ["cek_f16*"] * 3 + ["float*"] + ["cek_f16*"] * 2 + ["int", "int", "float"],
    "bf16": ["cek_bf16*"] * 3 + ["float*"] + ["cek_bf16*"] * 2 + ["int", "int", "float"],
}
MARGIN = 0.25


@pytest.mark.parametrize("dtype", list(C_TYPES))
def test_the_launch_tuple_is_the_documented_nine_in_order(dtype):
    kernel = Backward(1024, dtype)
    assert [a.name for a in kernel.args] == NAMES
    assert [kernel.c_type(a) for a in kernel.args] == C_TYPES[dtype]
    params = ", ".join(f"{t} {n}" for t, n in zip(C_TYPES[dtype], NAMES))
    assert f"cosine_embedding_loss_backward_entry_point({params})" in kernel.entry_point_source
    element = "" if dtype == "f32" else f", {dtypes.get(dtype).c_type}"
    assert (f"cosine_embedding_loss_backward<1024{element}>({', '.join(NAMES)});"
            in kernel.entry_point_source)


@pytest.mark.parametrize("dtype", list(C_TYPES))
@pytest.mark.parametrize("block_size", [1, 32, 1024, 1 << 20])
def test_the_documented_fields(dtype, block_size):
    kernel = Backward(block_size, dtype)
    assert kernel.name == "cosine_embedding_loss_backward"
    assert kernel.id == f"cosine_embedding_loss_backward__{dtype}__{block_size}"
    assert kernel.block_size == block_size
    assert kernel.entry_point_name() == "cosine_embedding_loss_backward_entry_point"
    assert kernel.kernel_source == load_kernel_source("cosine_embedding_loss_backward.cu")
    assert "template <int BLOCK_SIZE" in kernel.kernel_source
    assert kernel.entry_point_source.count('extern "C" __global__') == 1
    assert kernel.source == kernel.kernel_source + "\n\n" + kernel.entry_point_source


@pytest.mark.parametrize("dtype", list(C_TYPES))
@pytest.mark.parametrize("n_dim", [1, 31, 33, 128, 257, 768, 4097, 8192, 16385, 1 << 20])
def test_grid_is_a_block_a_row_and_block_size_the_next_power_of_two(dtype, n_dim):
    kernel = Backward.for_n_dim(n_dim, dtype)
    assert kernel.block_size == next_power_of_two(n_dim)
    for n_rows in (1, 7, 300):
        grid, block, _ = kernel.launch_config(n_rows, n_dim)
        assert grid == (n_rows, 1, 1)
        assert block[1:] == (1, 1) and block[0] % 32 == 0 and block[0] <= 1024
    if n_dim > 1:  # another width's BLOCK_SIZE is refused
        with pytest.raises(ValueError, match=f"n_dim={n_dim} needs block_size="):
            Backward(next_power_of_two(n_dim) // 2, dtype).launch_config(3, n_dim)


def test_the_tuple_checks_count_and_types():
    kernel = Backward(8)
    f = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    args = [f(3), f(3, 5), f(3, 5), f(3), f(3, 5), f(3, 5), 3, 5, 0.5]
    cast = kernel.check_args(args, (np.ndarray,))
    assert [type(v) for v in cast[6:]] == [np.int32, np.int32, np.float32]
    with pytest.raises(TypeError, match="takes 9 arguments, got 11"):
        kernel.check_args([args[0], 1, 1.0, *args[1:]], (np.ndarray,))
    with pytest.raises(ValueError, match=r"dy must have shape \(n_rows\) = \(3,\), got \(\)"):
        kernel.check_args([np.zeros((), np.float32), *args[1:]], (np.ndarray,))


def _torch_gradients(inputs, margin):
    """float64 torch's gradients of the per-row loss for grad_outputs dy."""
    torch = pytest.importorskip("torch")
    dtype = inputs["dtype"]
    x1, x2 = (torch.tensor(dtypes.to_float64(inputs[k], dtype), requires_grad=True)
              for k in ("x1", "x2"))
    loss = torch.nn.functional.cosine_embedding_loss(
        x1, x2, torch.tensor(inputs["y"], dtype=torch.float64), margin=margin, reduction="none")
    dy = torch.tensor(dtypes.to_float64(inputs["dy"], dtype))
    dx1, dx2 = torch.autograd.grad(loss, (x1, x2), dy)
    return {"dx1": dx1.numpy(), "dx2": dx2.numpy()}


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", list(C_TYPES))
@pytest.mark.parametrize("n_rows, n_dim", [(7, 33), (5, 768), (3, 4097)])
def test_nine_argument_launch_matches_float64_torch(dtype, n_rows, n_dim):
    """The nine arguments as documented, on the emulator (the kernel's own source), against
    float64 torch: one dy a row, unscaled; outputs NaN-filled first."""
    kernel = Backward.for_n_dim(n_dim, dtype)
    inputs = check.make_inputs(n_rows, n_dim, seed=n_dim, dtype=dtype)
    # what cek's own kernels take beside dy: a launch of the documented kernel ignores them
    inputs.update(dy_stride=1, scale=0.5)
    args, outputs = check.build_args(kernel, inputs, MARGIN)
    assert len(args) == 9 and args[0] is inputs["dy"]
    grid, block, smem = kernel.launch_config(n_rows, n_dim)
    emulate.load(kernel)(grid, block, args, shared_mem=smem)
    want = _torch_gradients(inputs, MARGIN)
    _, size = check.expected(kernel, inputs, MARGIN)
    failures = check.compare(outputs, want, size, dtype)[2]
    assert not failures, failures
    # the reference agrees with torch and reads dy unscaled for this kernel
    reference, _ = check.expected(kernel, inputs, MARGIN)
    for name in ("dx1", "dx2"):
        np.testing.assert_allclose(reference[name], want[name], rtol=1e-9, atol=1e-12)


@pytest.mark.compile
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_the_compiled_entry_point_takes_nine_parameters(dtype):
    """The C ABI NVRTC emits: the symbol entry_point_name(), six pointers, two 32-bit ints and
    the margin (f32 in float32)."""
    from cek.compile import compile_kernel

    kernel = Backward.for_n_dim(768, dtype)
    ptx = compile_kernel(kernel, "sm_80").ptx
    entry = re.search(r"\.entry\s+" + kernel.entry_point_name() + r"\s*\((.*?)\)", ptx, re.S)
    assert entry, "no entry point of that name in the PTX"
    kinds = re.findall(r"\.param\s+\.(\w+)", entry.group(1))
    assert kinds == ["u64"] * 6 + ["u32", "u32", "f32"]
