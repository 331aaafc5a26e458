"""cek loads native code from its cache only where no one but the user could have put it.

A library in the cache runs its constructors in the caller's process once loaded, and its name
and checksum are things anyone can compute. So each test plants, beside a real cache, a library
whose constructor writes a marker file, makes the cache one that another user could have written
(a folder others can write, a file another user owns), and checks that the marker never appears
while the work still runs, on code built in a private folder. The runs happen in subprocesses:
a fresh process has nothing loaded or remembered, and its stderr is its own.
"""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cek
import cek.functional as F
from cek import cpu_native
from cek.emulate import CacheDirError, build
from oracle import assert_close, expected

pytestmark = pytest.mark.emulator  # needs g++

REPO = Path(__file__).resolve().parent.parent
OTHER_UID = 65534  # nobody
ROWS = "rows-*.so"
KERNEL = "cosine_*-plain-*.so"
# One float64 loss through cek.functional on NumPy arrays (the compiled rows when they load).
CPU = """
import json, numpy as np, cek.functional as F
from cek import cpu_native
from cek.emulate import build
x1 = np.arange(12.0).reshape(3, 4); x2 = x1[::-1].copy(); y = np.array([1.0, -1.0, 1.0])
loss = F.cosine_embedding_loss(x1, x2, y, 0.0, "sum")
print(json.dumps({"loss": float(loss), "why_numpy": cpu_native.unavailable_reason(),
                  "compiles": build.compiles}))
"""
# One emulator launch of the forward kernel on fixed rows.
EMULATE = """
import json, numpy as np, cek
from cek.emulate import build
k = cek.CosineEmbeddingLossForward.for_n_dim(8)
x1 = np.arange(24, dtype=np.float32).reshape(3, 8); x2 = x1[::-1].copy()
y = np.array([1, -1, 1], np.float32); out = np.full(3, np.nan, np.float32)
grid, block, smem = k.launch_config(3, 8)
cek.emulate.load(k)(grid, block, (x1, x2, y, out, 3, 8, 0.0), shared_mem=smem)
print(json.dumps({"loss": out.tolist(), "compiles": build.compiles}))
"""
CONSTRUCTOR = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE* f = fopen("%s", "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


def child(script, env, umask=None, marker=None):
    """Run `script` in a fresh process with this tree first on the path; (its JSON, stderr).
    `marker`: a file that must not exist after the run, whatever else happened."""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "CEK_CPU_NATIVE": "1", **env},
        preexec_fn=None if umask is None else lambda: os.umask(umask))
    assert marker is None or not marker.exists(), "the planted library's constructor ran"
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def in_cache(cache):
    return {"CEK_CACHE_DIR": str(cache)}


def expected_cpu_loss():
    x1 = np.arange(12.0).reshape(3, 4)
    return expected(x1, x1[::-1], np.array([1.0, -1.0, 1.0]), 0.0, "sum", 1.0)[0]


def expected_emulate_losses():
    x1 = np.arange(24.0).reshape(3, 8)
    return expected(x1, x1[::-1], np.array([1.0, -1.0, 1.0]), 0.0, "none", np.ones(3))[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache that holds the CPU rows' library and one emulator kernel, built once."""
    cache = tmp_path_factory.mktemp("built") / "cache"
    child(CPU, in_cache(cache))
    child(EMULATE, in_cache(cache))
    return cache


@pytest.fixture
def cache(built, tmp_path):
    """A copy of the built cache, modes and all, for this test to spoil."""
    copy = tmp_path / "cache"
    shutil.copytree(built, copy)
    return copy


def plant(target: Path, source: str):
    """Replace target with a library built from `source`, with a checksum that matches it."""
    c_file = target.with_name("planted.c")
    c_file.write_text(source)
    subprocess.run(["g++", "-shared", "-fPIC", "-x", "c", str(c_file), "-o", str(target)],
                   check=True)
    c_file.unlink()
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    target.with_name(target.name + ".sha256").write_text(digest + "\n")


def plant_marker(target: Path, tmp_path: Path) -> Path:
    marker = tmp_path / "constructor-ran"
    plant(target, CONSTRUCTOR % marker)
    return marker


def one(folder: Path, pattern: str) -> Path:
    (path,) = folder.glob(pattern)
    return path


def needs_root():
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another user (os.chown)")


def others_can_write_the_root(cache, library):
    cache.chmod(0o777)
    return cache


def others_can_write_the_folder(cache, library):
    library.parent.chmod(0o777)
    return library.parent


def the_group_can_write_the_file(cache, library):
    library.chmod(0o775)
    return library


def another_user_owns_the_file(cache, library):
    needs_root()
    os.chown(library, OTHER_UID, OTHER_UID)
    return library


def another_user_owns_the_folder(cache, library):
    needs_root()
    os.chown(library.parent, OTHER_UID, OTHER_UID)
    return library.parent


SPOIL = [others_can_write_the_root, others_can_write_the_folder, the_group_can_write_the_file,
         another_user_owns_the_file, another_user_owns_the_folder]


def said_once(stderr: str, level: Path) -> str:
    (line,) = [line for line in stderr.splitlines() if "not loading" in line]
    assert str(level) in line, line
    return line


@pytest.mark.parametrize("spoil", SPOIL, ids=lambda f: f.__name__)
def test_a_planted_rows_library_is_not_loaded(cache, tmp_path, spoil):
    library = one(cache / "cpu", ROWS)
    marker = plant_marker(library, tmp_path)
    level = spoil(cache, library)
    result, stderr = child(CPU, in_cache(cache), marker=marker)
    assert result["why_numpy"] is None  # the rows were built again, in a private folder
    assert result["compiles"] == 1
    assert_close(result["loss"], expected_cpu_loss(), np.float64, "loss")
    line = said_once(stderr, level)
    fix = f"rm {level}" if level == library else ("CEK_CACHE_DIR" if "uid" in line else
                                                  f"chmod go-w {level}")
    assert fix in line, line
    private = Path(line.split("Building in ")[1].split()[0])
    assert private.parent != cache and not private.exists()  # removed when the process ended


@pytest.mark.parametrize("spoil", [others_can_write_the_folder, another_user_owns_the_file],
                         ids=lambda f: f.__name__)
def test_a_planted_emulator_library_is_not_loaded(cache, tmp_path, spoil):
    library = one(cache / "emulate", KERNEL)
    marker = plant_marker(library, tmp_path)
    level = spoil(cache, library)
    result, stderr = child(EMULATE, in_cache(cache), marker=marker)
    assert_close(result["loss"], expected_emulate_losses(), np.float32, "loss")
    # The runtime object (in the same folder) and the kernel are built again; said once.
    assert result["compiles"] == (2 if level == library.parent else 1)
    said_once(stderr, level)


@pytest.fixture
def fresh_cpu_native(monkeypatch):
    monkeypatch.setenv("CEK_CPU_NATIVE", "1")
    cpu_native._library.cache_clear()
    cpu_native._why_not.clear()
    yield
    cpu_native._library.cache_clear()
    cpu_native._why_not.clear()


def test_a_rows_library_without_the_functions_sends_the_call_to_numpy(
        cache, monkeypatch, fresh_cpu_native):
    library = one(cache / "cpu", ROWS)
    plant(library, "int cek_something_else(void) { return 1; }\n")
    monkeypatch.setenv("CEK_CACHE_DIR", str(cache))
    x1 = np.arange(12.0).reshape(3, 4)
    loss = F.cosine_embedding_loss(x1, x1[::-1].copy(), np.array([1.0, -1.0, 1.0]), 0.0, "sum")
    assert_close(loss, expected_cpu_loss(), np.float64, "loss")
    why = cpu_native.unavailable_reason()
    assert why is not None and str(library) in why and "cek_cpu_rows_f32" in why, why
    assert "remove it" in why and "\n" not in why, why


def test_an_emulator_library_without_the_entry_points_is_a_one_line_error(cache, monkeypatch):
    library = one(cache / "emulate", KERNEL)
    plant(library, "int cek_something_else(void) { return 1; }\n")
    monkeypatch.setenv("CEK_CACHE_DIR", str(cache))
    build.forget()
    with pytest.raises(CacheDirError) as caught:
        cek.emulate.load(cek.CosineEmbeddingLossForward.for_n_dim(8))
    message = str(caught.value)
    assert str(library) in message and "cek_launch" in message and "remove it" in message
    assert "\n" not in message, message
    build.forget()


@pytest.mark.parametrize("where, umask", [("default", None), ("CEK_CACHE_DIR", 0o002)])
def test_a_users_own_cache_is_made_private_and_reused_without_a_build(tmp_path, where, umask):
    """The default cache, and a private CEK_CACHE_DIR under the umask 002 that many systems give
    their users: folders cek makes are 0700, files it writes are not group-writable, so the
    next process loads them at once, without a build and without a word."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CACHE_HOME": "", "CEK_CACHE_DIR": ""}
    if where == "default":
        cache, made = home / ".cache" / "cek", [home / ".cache", home / ".cache" / "cek"]
    else:
        cache, made = tmp_path / "mine" / "cek", [tmp_path / "mine", tmp_path / "mine" / "cek"]
        env["CEK_CACHE_DIR"] = str(cache)
    first, _ = child(CPU, env, umask)
    assert first["compiles"] == 1 and first["why_numpy"] is None
    for folder in (*made, cache / "cpu"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    second, stderr = child(CPU, env, umask)
    assert second["compiles"] == 0 and second["why_numpy"] is None
    assert stderr == ""
    assert_close(second["loss"], expected_cpu_loss(), np.float64, "loss")
