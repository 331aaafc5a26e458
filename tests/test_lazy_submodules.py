"""`import cek` reaches every submodule on first use (PEP 562) without importing it eagerly."""

import subprocess
import sys

import pytest

import cek


def run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_readme_emulator_snippet_needs_no_submodule_import():
    code = ("import sys, cek; print('cek.emulate' in sys.modules); "
            "k = cek.CosineEmbeddingLossForward.for_n_dim(8); "
            "print(cek.emulate.load.__module__, 'cek.emulate' in sys.modules, "
            "'torch' in sys.modules, 'cupy' in sys.modules)")
    assert run(code) == ["False", "cek.emulate", "True", "False", "False"]


@pytest.mark.parametrize("name", cek._LAZY)
def test_every_lazy_name_is_its_submodule(name):
    if name == "torch":
        pytest.importorskip("torch")
    assert getattr(cek, name).__name__ == f"cek.{name}"
    assert name in dir(cek)


def test_a_missing_attribute_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'cek' has no attribute 'emulator'"):
        cek.emulator  # noqa: B018
    assert not hasattr(cek, "nothing")


def test_function_names_stay_functions_once_their_kernel_modules_are_imported():
    # cek.cosine_embedding_loss_fused is a function of cek.functional and a kernel module's
    # name: importing the module must not put the module in the function's place.
    code = ("import cek, cek.cosine_embedding_loss_fused, cek.cosine_embedding_loss_backward; "
            "print(cek.cosine_embedding_loss_fused.__module__, "
            "cek.cosine_embedding_loss_backward.__module__, 'numpy' in __import__('sys').modules)")
    assert run(code) == ["cek.functional", "cek.functional", "True"]
    assert run("import sys, cek; print('numpy' in sys.modules)") == ["False"]
