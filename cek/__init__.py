"""cek: fast, checked cosine embedding loss kernels for NVIDIA GPUs."""

from cek.cosine_embedding_loss_backward import (CosineEmbeddingLossBackward,
                                                CosineEmbeddingLossBackwardRows)
from cek.cosine_embedding_loss_forward import (CosineEmbeddingLossForward,
                                               CosineEmbeddingLossForwardRows)
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
from cek import gpu, reference
from cek.functional import (
    cosine_embedding_loss,
    cosine_embedding_loss_backward,
    cosine_embedding_loss_fused,
)
from cek.kernel import Arg, Kernel

__version__ = "0.1.0"

__all__ = [
    "Arg",
    "CosineEmbeddingLossBackward",
    "CosineEmbeddingLossBackwardRows",
    "CosineEmbeddingLossForward",
    "CosineEmbeddingLossForwardRows",
    "CosineEmbeddingLossFused",
    "Kernel",
    "__version__",
    "cosine_embedding_loss",
    "cosine_embedding_loss_backward",
    "cosine_embedding_loss_fused",
    "gpu",
    "reference",
]
