"""Restoring the effective rank of VQ codebooks.

Paper: "Unveiling and Addressing Dimensional Collapse in Vector Quantization Models via Codebook Regularization"
(DimVQ), Zhang, Zhu, Liu, Fu, Xu, ICML 2026. https://github.com/ksblk2116/dimvq

Vector-quantised autoencoders collapse dimensionally: even at full code utilisation the codebook spans far fewer
effective dimensions than the encoder's continuous outputs. A decorrelation penalty on the (projected) codebook
restores the rank, which the paper reports improves reconstruction and downstream autoregressive generation.

``effective_rank`` / ``spectral_report`` (the metric), ``CodebookRegularizer`` (the loss, for this module's
quantisers and vector-quantize-pytorch's), ``VectorQuantizer`` and ``SimVQQuantizer`` (official affine projection,
optional dead-code restarts). Not implemented: the VQGAN/ImageNet training of the paper (the reproduction uses
a small convolutional VQ-VAE on patches of scikit-learn's bundled photographs), IBQ.
"""

from .module import (
    CodebookRegularizer,
    EffectiveRankCallback,
    SimVQQuantizer,
    VectorQuantizer,
    codebook_decorrelation_loss,
    codebook_of,
    effective_rank,
    spectral_report,
)

__all__ = [
    "CodebookRegularizer",
    "EffectiveRankCallback",
    "SimVQQuantizer",
    "VectorQuantizer",
    "codebook_decorrelation_loss",
    "codebook_of",
    "effective_rank",
    "spectral_report",
]
