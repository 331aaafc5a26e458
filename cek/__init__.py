"""cek: fast, checked cosine embedding loss kernels for NVIDIA GPUs."""

from cek.cosine_embedding_loss_backward import (CosineEmbeddingLossBackward,
                                                CosineEmbeddingLossBackwardKeep,
                                                CosineEmbeddingLossBackwardRows)
from cek.cosine_embedding_loss_forward import (CosineEmbeddingLossForward,
                                               CosineEmbeddingLossForwardRows)
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
from cek import gpu, reference
from cek.functional import (
    cosine_embedding_loss,
    cosine_embedding_loss_backward,
    cosine_embedding_loss_fused,
)
from cek.kernel import Arg, Kernel

__version__ = "0.1.0"

# Submodules imported on first use (PEP 562), so `import cek; cek.emulate.load(...)` works while
# `import cek` stays free of CuPy, torch and the emulator's compiler checks.
_LAZY = ("bench", "check", "cli", "compile", "cpu", "cpu_native", "dtypes", "emulate", "functional", "kernel",
         "occupancy", "plot", "report", "sass", "sources", "torch", "validate")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"cek.{name}")
    raise AttributeError(f"module 'cek' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


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
