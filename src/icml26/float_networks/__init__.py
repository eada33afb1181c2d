"""Floating-point networks that represent values and autodiff gradients exactly.

Paper: "Floating-Point Networks with Automatic Differentiation Can Represent Almost All Floating-Point Functions
and Their Gradients", Geonho Hwang et al., ICML 2026. https://arxiv.org/abs/2605.01702

``construct`` builds a network whose float forward values and autograd input-gradients (through an outer phi)
equal given targets bit for bit on a finite domain; ``verify`` checks any network point by point (exactness, ulp
distances, unreachable targets, signs of zero); ``saturation_thresholds`` scans an activation's exactly saturated
regimes with large upstream gradients; ``register_activation`` adds an activation with the same guarantees.
The construction is the project's own (only the abstract is public).
"""

from .construct import (
           ACTIVATIONS,
           DTYPES,
           FAMILIES,
           FloatNetwork,
           Unreachable,
           construct,
           phi_slope,
           register_activation,
           saturation_thresholds,
           upstream_probes,
)
from .verify import VerificationResult, ulp_distance, verify

__all__ = ["ACTIVATIONS", "DTYPES", "FAMILIES", "FloatNetwork", "Unreachable", "VerificationResult", "construct",
           "phi_slope", "register_activation", "saturation_thresholds", "ulp_distance", "upstream_probes", "verify"]
