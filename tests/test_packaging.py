"""cpu tier: a built wheel carries kernels/ and works when installed without the source tree."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True)
    (path,) = out.glob("cek-*.whl")
    return path


def test_wheel_carries_every_kernel_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for source in sorted((ROOT / "kernels").iterdir()):
        assert f"cek/_kernels/{source.name}" in names
    assert "cek/cli.py" in names
    assert "cek/cpu_native.cpp" in names  # the CPU path compiles it on first use
    emulator_files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "cek" / "emulate").glob("*")
                      if p.is_file() and p.suffix != ".pyc"}
    assert emulator_files <= names


def test_installed_wheel_finds_its_kernels_outside_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--target", str(target), str(wheel)], check=True)
    code = ("import cek, cek.sources as s; "
            "print(s.kernels_dir()); print(cek.CosineEmbeddingLossBackward(1024).kernel_source)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == str(target / "cek" / "_kernels")
    assert "cek_row.cuh" in result.stdout
