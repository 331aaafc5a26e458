"""cpu tier: the source distribution carries what the README links and the license
pyproject.toml names."""

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sdist_names(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True)
    (path,) = out.glob("cek-*.tar.gz")
    with tarfile.open(path) as tar:
        top = tar.getnames()[0].split("/")[0]
        return {name.removeprefix(top + "/") for name in tar.getnames()}, tar.extractfile(
            f"{top}/LICENSE").read().decode()


def test_the_license_is_the_one_pyproject_names():
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_sdist_carries_the_license_and_every_file_the_readme_links(sdist_names):
    names, license_text = sdist_names
    assert license_text == (ROOT / "LICENSE").read_text()
    links = set(re.findall(r"\]\(([^)#:]+?)(?:#[^)]*)?\)", (ROOT / "README.md").read_text()))
    assert "CHANGELOG.md" in links  # the parser finds the links it must
    missing = sorted(link for link in links if link not in names and not any(
        n.startswith(link.rstrip("/") + "/") for n in names))
    assert not missing, f"README links files the sdist lacks: {missing}"
