"""Kernel source text does not depend on where the package lives (cek.sources), and a sanitizer
report still locates a kernel line through the relative `#line` names."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cek
from cek import emulate
from cek.emulate import sanitize as sanitized
from cek.kernel import Arg, Kernel

REPO = Path(__file__).resolve().parent.parent
PLANTED = Path(__file__).resolve().parent / "planted"


def test_one_kernel_has_one_cache_key_in_every_checkout(tmp_path):
    code = "import cek; print(cek.CosineEmbeddingLossFused(1024, 'f16').cache_key())"
    keys = []
    for checkout in ("a", "b/deeper"):
        root = tmp_path / checkout
        shutil.copytree(REPO / "cek", root / "cek", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "kernels", root / "kernels")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(root)}, cwd=root, check=True)
        keys.append(done.stdout.strip())
    assert keys == [cek.CosineEmbeddingLossFused(1024, "f16").cache_key()] * 2


def test_line_directives_name_kernels_relative_paths():
    source = cek.CosineEmbeddingLossBackward(1024, "bf16").source
    names = {line.split('"')[1] for line in source.splitlines() if line.startswith("#line")}
    assert names == {"kernels/cosine_embedding_loss_backward.cu", "kernels/cek_row.cuh",
                     "kernels/cek_types.cuh", "kernels/cek_tiling.cuh", "kernels/cek_chunk.cuh",
                     "kernels/cek_sums.cuh", "kernels/cek_loss.cuh", "kernels/cek_huge.cuh",
                     "kernels/cek_stream.cuh", "kernels/cek_block_row.cuh",
                     "kernels/cek_row_group.cuh"}


class RelativeOffByOne(Kernel):
    """tests/planted/off_by_one_store.cu under a `kernels/...` name, as cek.sources names files."""

    name = "planted_off_by_one_store"
    args = (Arg("x", "float*", ("n_rows", "n_dim")),
            Arg("out", "float*", ("n_rows", "n_dim"), output=True),
            Arg("n_rows", "int"), Arg("n_dim", "int"))

    @property
    def kernel_source(self) -> str:
        return f'#line 1 "kernels/off_by_one.cu"\n{(PLANTED / "off_by_one_store.cu").read_text()}'


@pytest.mark.emulator
def test_a_sanitizer_report_locates_a_relative_kernel_path():
    try:
        sanitized._preload("address")
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"sanitize='address' unavailable: {exc}")
    x = np.ones((2, 64), np.float32)
    with pytest.raises(emulate.KernelError) as caught:
        emulate.load(RelativeOffByOne(128), sanitize="address")((2,), (64,), (x, x * 0, 2, 64))
    assert (caught.value.file, caught.value.line) == ("kernels/off_by_one.cu", 7), str(caught.value)
