"""Floating-point networks that represent values and autodiff gradients.

Paper: "Floating-Point Networks with Automatic Differentiation Can Represent Almost All Floating-Point Functions and Their Gradients", ICML 2026. https://arxiv.org/abs/2605.01702

Given float points, target values and target gradients, construct a network whose floating-point forward pass
and whose autodiff gradient (through an outer phi) hit the targets bit for bit, for ReLU, ELU, GELU, SiLU,
sigmoid and tanh in float32, float16 and bfloat16.

Status: planned — not implemented yet (issue #15). ``icml26 info float_networks`` shows the card and its claims.
"""
