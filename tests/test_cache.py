"""The emulator's build cache survives damage and odd environments (cek.emulate.build).

A damaged library must never reach dlopen: a truncated one dies with a bus error, a garbled one
with SIGILL or SIGSEGV, so those runs happen in a subprocess and the test reads its exit status.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import cek
from cek.emulate import CacheDirError, build
from oracle import expected_rows

pytestmark = pytest.mark.emulator

REPO = Path(__file__).resolve().parent.parent
KERNEL = cek.CosineEmbeddingLossForward.for_n_dim(8)
# Loads and launches KERNEL on fixed rows, prints the losses.
LAUNCH = """
import numpy as np, cek
k = cek.CosineEmbeddingLossForward.for_n_dim(8)
x1 = np.arange(24, dtype=np.float32).reshape(3, 8); x2 = x1[::-1].copy()
y = np.array([1, -1, 1], np.float32); out = np.full(3, np.nan, np.float32)
grid, block, smem = k.launch_config(3, 8)
cek.emulate.load(k)(grid, block, (x1, x2, y, out, 3, 8, 0.0), shared_mem=smem)
print(*out.tolist())
"""


def expected_losses():
    x1 = np.arange(24, dtype=np.float64).reshape(3, 8)
    return expected_rows(x1, x1[::-1], np.array([1, -1, 1]), np.zeros(3), 0.0)[0]


def launch_in_child(cache: Path, cwd: Path = REPO, **env):
    environment = {**os.environ, "CEK_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-c", LAUNCH], capture_output=True, text=True,
                          env=environment, cwd=cwd, timeout=300)


def assert_launch_works(done):
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    np.testing.assert_allclose([float(v) for v in done.stdout.split()], expected_losses(),
                               rtol=1e-5, atol=1e-6)


def cached(cache: Path, pattern: str) -> Path:
    (path,) = (cache / "emulate").glob(pattern)
    return path


def truncate(path: Path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garble(path: Path):
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(1)
    start = len(data) // 8
    data[start:] = rng.integers(0, 256, len(data) - start, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def empty(path: Path):
    path.write_bytes(b"")


@pytest.mark.parametrize("damage", [truncate, garble, empty], ids=lambda f: f.__name__)
@pytest.mark.parametrize("pattern", ["cosine_*.so", "runtime-plain-*.o"])
def test_a_damaged_cached_file_is_rebuilt_not_loaded(tmp_path, damage, pattern):
    assert_launch_works(launch_in_child(tmp_path))
    path = cached(tmp_path, pattern)
    damage(path)
    if pattern.startswith("runtime"):  # the runtime is only read to link a new library
        for library in (tmp_path / "emulate").glob("cosine_*"):
            library.unlink()
    assert_launch_works(launch_in_child(tmp_path))
    assert path.with_name(path.name + ".sha256").read_text().strip() == \
        build._file_digest(path)


def test_a_file_without_its_checksum_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("CEK_CACHE_DIR", str(tmp_path))
    build.forget()
    library = build.library(KERNEL)
    checksum = library.with_name(library.name + ".sha256")
    checksum.unlink()  # as a build killed between the library and its checksum leaves it
    build.forget()
    before = build.compiles
    assert build.library(KERNEL) == library
    assert build.compiles == before + 1 and checksum.is_file()
    build.forget()
    assert build.library(KERNEL) == library and build.compiles == before + 1  # now trusted


def test_a_killed_builds_folder_is_removed_once_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("CEK_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "emulate"
    stale, fresh = folder / ".build-killed", folder / ".build-running"
    for left in (stale, fresh):
        left.mkdir(parents=True)
        (left / "kernel.cpp").write_text("half written")
    hour_ago = time.time() - build.STALE_BUILD_S - 60
    os.utime(stale, (hour_ago, hour_ago))
    build.forget()
    build.library(KERNEL)
    assert not stale.exists() and fresh.exists()


def test_a_build_killed_with_sigkill_leaves_no_folder_behind(tmp_path):
    """A real `kill -9` in the middle of g++: the next build removes the folder at once."""
    folder = tmp_path / "emulate"
    child = subprocess.Popen([sys.executable, "-c", LAUNCH], env={
        **os.environ, "CEK_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(folder.glob(".build-*")) and child.poll() is None:
            assert time.monotonic() < deadline, "no build started"
            time.sleep(0.02)
        child.kill()
    finally:
        child.wait()
    left = list(folder.glob(".build-*"))
    assert left, "the child finished its build before it could be killed"
    assert_launch_works(launch_in_child(tmp_path))
    assert not any(path.exists() for path in left), left


@pytest.mark.parametrize("variable, value, where", [
    ("CEK_CACHE_DIR", "rel/cache", "rel/cache"),
    ("XDG_CACHE_HOME", "rel", "rel/cek"),
    ("CEK_CACHE_DIR", "~/quoted", "home/quoted"),
    ("XDG_CACHE_HOME", "~/xdg", "home/xdg/cek"),
])
def test_relative_and_quoted_tilde_cache_dirs_work(tmp_path, variable, value, where):
    (tmp_path / "home").mkdir()
    env = {"CEK_CACHE_DIR": "", "XDG_CACHE_HOME": "", "HOME": str(tmp_path / "home"),
           variable: value}
    done = subprocess.run([sys.executable, "-c", LAUNCH], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env}, cwd=tmp_path,
                          timeout=300)
    assert_launch_works(done)
    assert list((tmp_path / where / "emulate").glob("cosine_*.so"))
    assert not (tmp_path / "~").exists()


def unusable_dirs(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    dirs = {"a file": a_file, "under a file": a_file / "cache", "under /proc": Path("/proc/cek")}
    read_only = tmp_path / "read_only"
    read_only.mkdir(mode=0o555)
    if os.geteuid() != 0:  # root writes anywhere
        dirs["read-only"] = read_only / "cache"
    return dirs


def test_an_unusable_cache_dir_is_one_oserror_naming_it_and_the_variable(tmp_path, monkeypatch):
    for what, path in unusable_dirs(tmp_path).items():
        monkeypatch.setenv("CEK_CACHE_DIR", str(path))
        build.forget()
        with pytest.raises(CacheDirError) as caught:
            build.library(KERNEL)
        message = str(caught.value)
        assert isinstance(caught.value, OSError), what
        assert str(path) in message and "set CEK_CACHE_DIR" in message, (what, message)
        assert "\n" not in message, what


def test_an_unusable_home_is_the_same_one_line_error(tmp_path, monkeypatch):
    home = tmp_path / "home_is_a_file"
    home.write_text("")
    monkeypatch.delenv("CEK_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    build.forget()
    with pytest.raises(CacheDirError, match=f"cannot use {home}/.cache/cek/emulate .*; set "
                                            "CEK_CACHE_DIR to a writable folder$"):
        build.library(KERNEL)
