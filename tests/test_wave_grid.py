"""cpu tier: a keep kernel's wave grid is one wave of the device it launches on, whatever its arch.

The device is planted: CuPy's answers for a T4 (sm_75: 40 SMs of 1024 threads and 16 blocks)
and an H100 (sm_90: 132 SMs of 2048 threads and 32 blocks), and a compiled function that says
how many registers it uses. The expected grids are worked by hand from those limits.
"""

import types

import pytest

from cek import gpu
from cek.kernel import kernel_classes

T4 = {"multiProcessorCount": 40, "major": 7, "minor": 5, "maxThreadsPerMultiProcessor": 1024,
      "maxBlocksPerMultiProcessor": 16, "regsPerMultiprocessor": 65536,
      "sharedMemPerMultiprocessor": 65536, "reservedSharedMemPerBlock": 0}
H100 = {"multiProcessorCount": 132, "major": 9, "minor": 0, "maxThreadsPerMultiProcessor": 2048,
        "maxBlocksPerMultiProcessor": 32, "regsPerMultiprocessor": 65536,
        "sharedMemPerMultiprocessor": 233472, "reservedSharedMemPerBlock": 1024}
CACHES = (gpu._launch_config, gpu.multiprocessors, gpu.sm_limits, gpu.resident_blocks)


@pytest.fixture
def plant(monkeypatch):
    """plant(props, **function attributes): the current device is one of `props`, and every
    kernel compiles to a function with those attributes (num_regs, shared_size_bytes)."""
    def plant(props, **function):
        runtime = types.SimpleNamespace(getDeviceProperties=lambda device_id: props)
        cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
            runtime=runtime, Device=lambda: types.SimpleNamespace(id=0)))
        monkeypatch.setattr(gpu, "require_cupy", lambda: cupy)
        monkeypatch.setattr(gpu, "get_function",
                            lambda kernel, options=(): types.SimpleNamespace(**function))
        for cache in CACHES:
            cache.cache_clear()

    yield plant
    for cache in CACHES:  # nothing planted outlives the test
        cache.cache_clear()


# Rows of 768 floats: blocks of 96 threads (3 warps of two chunk pairs a thread). With 40
# registers a warp takes 1280 of a sub-partition's 16384, so 12 warps a sub-partition, 48 an SM:
# 16 blocks by registers.
#   T4: 1024 threads = 32 warps, 10 blocks of 3 warps: 10 an SM (its limit is 16), 400 on 40 SMs.
#   H100: 64 warps, 21 blocks by threads, 16 by registers: 16 an SM, 2112 on 132 SMs.
# With 32 registers (16 warps a sub-partition, 64 an SM: 21 blocks) the H100 holds 21: 2772.
@pytest.mark.parametrize("props, registers, grid", [(T4, 40, 400), (H100, 40, 2112),
                                                    (H100, 32, 2772), (T4, 32, 400)],
                         ids=["t4-40", "h100-40", "h100-32", "t4-32"])
def test_the_keep_kernels_grid_is_one_wave_of_the_device(plant, props, registers, grid):
    plant(props, num_regs=registers, shared_size_bytes=256)
    kernel = kernel_classes()["backward-keep"].for_n_dim(768, "f32")
    assert gpu.launch_config(kernel, 1 << 20, 768) == ((grid, 1, 1), (96, 1, 1), 0)


def test_a_block_of_1024_threads_is_one_an_sm75_sm(plant):
    # The split's keep kernel: blocks of 1024 threads, one a T4 SM holds; two on an H100's.
    kernel = kernel_classes()["backward-keep-split"].for_n_dim(1 << 20, "f32")
    plant(T4, num_regs=32, shared_size_bytes=512)
    assert gpu.launch_config(kernel, 1 << 12, 1 << 20)[0] == (40, 1, 1)
    plant(H100, num_regs=32, shared_size_bytes=512)
    assert gpu.launch_config(kernel, 1 << 12, 1 << 20)[0] == (264, 1, 1)


def test_shared_memory_can_bind(plant):
    # 20000 static bytes a block: a T4 SM's 65536 hold 3 (in 256-byte units), fewer than the 5
    # its threads allow.
    plant(T4, num_regs=32, shared_size_bytes=20000)
    kernel = kernel_classes()["backward-keep"].for_n_dim(768, "f32")
    assert gpu.launch_config(kernel, 1 << 20, 768)[0] == (120, 1, 1)


def test_without_the_functions_registers_the_launch_bounds_promise_bounds_them(plant):
    # A stand-in function that does not say its registers: __launch_bounds__' min_blocks stands
    # for them, within what the SM's threads allow (10 blocks of 96 on a T4).
    plant(H100)
    kernel = kernel_classes()["backward-keep"].for_n_dim(768, "f32")
    assert gpu.launch_config(kernel, 1 << 20, 768)[0] == (kernel.min_blocks * 132, 1, 1)
    plant(T4)
    assert gpu.launch_config(kernel, 1 << 20, 768)[0] == (min(kernel.min_blocks, 10) * 40, 1, 1)


def test_a_small_problem_takes_a_block_a_row_group(plant):
    plant(T4, num_regs=40, shared_size_bytes=256)
    kernel = kernel_classes()["backward-keep"].for_n_dim(768, "f32")
    assert gpu.launch_config(kernel, 150, 768)[0] == (150, 1, 1)


def test_blocks_per_sm_is_checked():
    kernel = kernel_classes()["backward-keep"].for_n_dim(768, "f32")
    with pytest.raises(ValueError, match="blocks_per_sm must be a positive int, got 0"):
        kernel.launch_config(1000, 768, sms=4, blocks_per_sm=0)
    assert kernel.launch_config(1000, 768, sms=4, blocks_per_sm=3)[0] == (12, 1, 1)
