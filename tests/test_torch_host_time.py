"""The host time of one cek.torch training step on the CUDA path against torch's own eager
forward + backward of this loss on tiny CPU tensors, timed in one run by
scripts/torch_host_time.py (the figures in docs/torch.md): small batches are bound by Python,
so this is what such a step costs. Only the call of the compiled kernel is stubbed."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "torch_host_time.py"
spec = importlib.util.spec_from_file_location("torch_host_time", SCRIPT)
host_time = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_time)

# On the 2-core CPU development machine, busy with other work, cek's step took 0.57 to 0.61
# times torch's (ten runs of the script, --repeats 30), since a launch signature and the checks
# on the tensors are worked out once and later launches pass pointers; 1.32 to 1.38 (three
# runs) before that, and 1.71 to 2.33 before the launch path was first trimmed. With the mean
# as a third launch (the reduction of the per-row losses), 0.53 to 0.71, median 0.65, on a
# busier machine (twelve runs, each beside a run of the two-launch step: 0.59 to 0.66, median
# 0.62). On the development machine of 2026-12-02 that code gave 0.79, idle (three runs), and
# 0.80 once in CI beside the NVRTC matrix; with each signature's plan keeping its compiled
# function, 0.74 to 0.75 (five runs). The bound leaves room for a busier machine and fails at
# the earlier figures. The
# issue's aim, a quarter of torch's, is not met: an empty autograd.Function's forward and
# backward alone take about a fifth of torch's step here (scripts/torch_host_time.py --profile
# shows the rest).
MAX_RATIO = 0.8


def test_cuda_path_step_against_torchs_eager_step():
    cek_s, torch_s, launches = host_time.measure()
    assert launches == 3, ("a cek step is the fused kernel, the reduction of its per-row "
                           f"losses and the keep kernel: the stub ran {launches}")
    ratio = cek_s / torch_s
    assert ratio <= MAX_RATIO, (f"cek {cek_s * 1e6:.0f} us, torch {torch_s * 1e6:.0f} us per "
                                f"step: {ratio:.2f} times torch's, above {MAX_RATIO}")


def test_at_a_users_shape_too():
    """16 x 768, a sentence-embedding batch: cek's step is still host time alone (3 launches),
    torch's computes a little on the CPU as well, and the bound holds (0.37 to 0.49 in four
    runs of `--shape 16x768` on the 2-core machine, load about 10)."""
    cek_s, torch_s, launches = host_time.measure(shape=(16, 768))
    assert launches == 3
    ratio = cek_s / torch_s
    assert ratio <= MAX_RATIO, (f"cek {cek_s * 1e6:.0f} us, torch {torch_s * 1e6:.0f} us per "
                                f"step at 16x768: {ratio:.2f} times torch's, above {MAX_RATIO}")


def test_the_shape_option():
    assert host_time._shape("128x1024") == (128, 1024)
    x1, x2, y = host_time.inputs(True, (7, 33))
    assert x1.shape == x2.shape == (7, 33) and y.shape == (7,) and set(y.tolist()) == {1.0, -1.0}
    for bad in ("128", "0x8", "ax8", "4x8x2"):
        with pytest.raises(Exception, match="a shape is NxD"):
            host_time._shape(bad)
