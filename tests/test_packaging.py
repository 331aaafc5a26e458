"""cpu tier: a built wheel carries kernels/ and works when installed without the source tree;
its dependencies give CuPy the NVRTC of its own CUDA, and CI installs what the README says. The
sdist carries the license pyproject.toml names and every file the README links."""

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _build(kind: str, out: Path) -> Path:
    """`python -m build --<kind>` of the checkout into `out`; the one file it made."""
    subprocess.run([sys.executable, "-m", "build", f"--{kind}", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True)
    (path,) = out.glob("cek-*.whl" if kind == "wheel" else "cek-*.tar.gz")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return _build("wheel", tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """(names in the sdist, relative to its top folder; its LICENSE's text)"""
    with tarfile.open(_build("sdist", tmp_path_factory.mktemp("sdist"))) as tar:
        top = tar.getnames()[0].split("/")[0]
        names = {name.removeprefix(top + "/") for name in tar.getnames()}
        return names, tar.extractfile(f"{top}/LICENSE").read().decode()


def test_the_license_is_the_one_pyproject_names():
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_sdist_carries_the_license_and_every_file_the_readme_links(sdist):
    names, license_text = sdist
    assert license_text == (ROOT / "LICENSE").read_text()
    links = set(re.findall(r"\]\(([^)#:]+?)(?:#[^)]*)?\)", (ROOT / "README.md").read_text()))
    assert "CHANGELOG.md" in links  # the parser finds the links it must
    missing = sorted(link for link in links if link not in names and not any(
        n.startswith(link.rstrip("/") + "/") for n in names))
    assert not missing, f"README links files the sdist lacks: {missing}"


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


def _requirements(wheel) -> dict[str, set[str]]:
    """The names the wheel's metadata requires, by extra ("" for the base install)."""
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    by_extra: dict[str, set[str]] = {}
    for requirement in re.findall(r"^Requires-Dist: (.+)$", text, re.M):
        extra = re.search(r"""extra == ['"]([\w-]+)['"]""", requirement)
        name = re.match(r"[A-Za-z0-9._-]+", requirement)[0].lower()
        by_extra.setdefault(extra[1] if extra else "", set()).add(name)
    return by_extra


def test_no_install_line_brings_an_nvrtc_of_another_cuda(wheel):
    """CuPy loads the newest NVRTC it finds: an NVRTC 13 beside CuPy for CUDA 12 would compile,
    for every CuPy user of the environment, code that a 12.x driver cannot load."""
    requires = _requirements(wheel)
    assert not {n for n in requires[""] if n.startswith(("nvidia-", "cuda-"))}  # the base: none
    cuda12, cuda13 = requires[""] | requires["cuda12"], requires[""] | requires["cuda13"]
    assert {"cupy-cuda12x", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12"} <= cuda12
    assert not {n for n in cuda12 if n.startswith("nvidia-") and not n.endswith("-cu12")}
    assert {"cupy-cuda13x", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime"} <= cuda13
    assert not {n for n in cuda13 if n.endswith("-cu12")}
    for extra in ("torch", "plot", "sass", "test"):  # these go beside either
        assert not {n for n in requires[extra] if "nvrtc" in n or n.startswith("cupy")}, extra
    assert {"cuda-bindings", "nvidia-cuda-nvrtc"} == requires["nvrtc"]


def _requirement(line: str) -> tuple[str, frozenset]:
    """A requirement's name and its version specifiers, in any order or spacing."""
    name, specifiers = re.fullmatch(r"\s*([A-Za-z0-9._-]+)\s*([^;]*?)\s*(;.*)?",
                                    line).group(1, 2)
    return name.lower(), frozenset(s.strip() for s in specifiers.split(",") if s.strip())


def test_doctors_install_lines_are_the_extras(wheel):
    """`cek doctor`'s fixes name the packages of the cuda12 and cuda13 extras (a line that
    works with cek installed as well as in a checkout): the same as the wheel requires."""
    from cek.doctor import EXTRAS

    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    for major, lines in EXTRAS.items():
        extra = {_requirement(r) for r in re.findall(
            rf"""^Requires-Dist: (.+?;.*extra == ['"]cuda{major}['"].*)$""", text, re.M)}
        assert {_requirement(line) for line in lines} == extra, major


def test_the_readme_install_lines_are_the_ones_ci_runs():
    """Each `pip install '.[...]'` of the README's install table and of docs/install.md is a line
    of .ci/driver-only.txt, which installs it on a simulated host with only the driver; the
    12.x driver's line with PyTorch is torch first, then `'.[cuda12]'`, which cannot bring
    torch's CUDA 13 build."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("| your machine")
    table = readme[start:readme.index("\n\n", start)]
    install = (ROOT / "docs" / "install.md").read_text()
    install = install[:install.index("\n## The other extras")]
    shown = set(re.findall(r"pip install '\.\[([\w,]+)\]'", install))
    assert set(re.findall(r"pip install '\.\[([\w,]+)\]'", table)) == shown
    lines = [line.split() for line in (ROOT / ".ci" / "driver-only.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert shown == {line[2] for line in lines} == {"cuda12", "cuda13", "nvrtc"}
    assert ["cuda12", "torch==2.13.0"] in [line[2:] for line in lines]
    assert "torch" not in {e for line in lines for e in line[2].split(",")}
    assert "PyTorch's install selector's CUDA 12.x" in " ".join(install.split())
