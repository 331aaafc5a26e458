"""cek: fast, checked cosine embedding loss kernels for NVIDIA GPUs.

Everything is imported on first use (PEP 562): `import cek` itself imports nothing, so the `cek`
command starts inside its own interrupt handling (cek.__main__.run), and `import cek` stays free
of NumPy, CuPy, torch and the emulator's compiler checks until a name is used.
"""

import sys as _sys
import types as _types

__version__ = "0.1.0"

# Submodules imported on first use, so `import cek; cek.emulate.load(...)` works.
_LAZY = ("bench", "check", "cli", "compile", "cpu", "cpu_native", "dtypes", "emulate",
         "functional", "gpu", "kernel", "occupancy", "plot", "reference", "report", "sass",
         "sources", "torch", "validate")
# The public names of the package, and the module each comes from.
_NAMES = {
    "Arg": "kernel_args",
    "CosineEmbeddingLossBackward": "cosine_embedding_loss_backward",
    "CosineEmbeddingLossBackwardKeep": "cosine_embedding_loss_backward",
    "CosineEmbeddingLossBackwardRows": "cosine_embedding_loss_backward",
    "CosineEmbeddingLossForward": "cosine_embedding_loss_forward",
    "CosineEmbeddingLossForwardRows": "cosine_embedding_loss_forward",
    "CosineEmbeddingLossFused": "cosine_embedding_loss_fused",
    "CosineEmbeddingLossReduce": "cosine_embedding_loss_reduce",
    "Kernel": "kernel",
    "cosine_embedding_loss": "functional",
    "cosine_embedding_loss_backward": "functional",
    "cosine_embedding_loss_fused": "functional",
}


class _Package(_types.ModuleType):
    """Importing cek.cosine_embedding_loss_fused (or _backward), a kernel module, sets the
    package's attribute of that name to the module; the name stays cek.functional's function."""

    def __setattr__(self, name, value):
        if name in _NAMES and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        return importlib.import_module(f"cek.{name}")
    if name in _NAMES:
        value = getattr(importlib.import_module(f"cek.{_NAMES[name]}"), name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module 'cek' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_NAMES))


__all__ = [
    "Arg",
    "CosineEmbeddingLossBackward",
    "CosineEmbeddingLossBackwardKeep",
    "CosineEmbeddingLossBackwardRows",
    "CosineEmbeddingLossForward",
    "CosineEmbeddingLossForwardRows",
    "CosineEmbeddingLossFused",
    "CosineEmbeddingLossReduce",
    "Kernel",
    "__version__",
    "cosine_embedding_loss",
    "cosine_embedding_loss_backward",
    "cosine_embedding_loss_fused",
    "gpu",
    "reference",
]
