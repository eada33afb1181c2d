"""Training-free, cluster-level token watermark for synthetic audio (HPT-WM).

Paper: "Hidden in Plain Tokens: Simply Robust, Gradient-Free Watermark for Synthetic Audio", Milis, Qin, Wu,
Huang, ICML 2026 (arXiv 2605.25967).

``RoundTripConfusion`` + ``ConfusionGraphClusterer`` build the reduced vocabulary from a codec's own round-trip
errors; ``ClusteredKGW`` biases generation (a ``transformers`` ``LogitsProcessor``) and detects from audio;
``FrameCodec`` is the small codec trained here (any ``Codec`` fits; ``EncodecCodec`` wraps a ``transformers``
EnCodec model). Needs the ``audio`` extra (and ``hf`` for the
LogitsProcessor and the token LM).
"""

from .clustering import ConfusionGraphClusterer, RoundTripConfusion, load_cluster_map, save_cluster_map
from .codec import Codec, EncodecCodec, FrameCodec, check_wave, train_codec
from .watermark import ClusteredKGW, keyed_seed, weighted_subset_null_pmf

__all__ = [
    "ClusteredKGW",
    "Codec",
    "ConfusionGraphClusterer",
    "EncodecCodec",
    "FrameCodec",
    "RoundTripConfusion",
    "check_wave",
    "keyed_seed",
    "load_cluster_map",
    "save_cluster_map",
    "train_codec",
    "weighted_subset_null_pmf",
]
