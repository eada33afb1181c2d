"""SARL: structure-aligned MARL for aircraft conflict resolution.

Paper: "SARL: Structure-Aligned Reinforcement Learning for Bridging the Perception-Action Gap in Airspace", ICML 2026 (poster 62482). https://icml.cc/virtual/2026/poster/62482

Multi-agent RL for air-traffic conflict resolution aligned with the problem's structure: a Physics-Encoded
Relational Graph encoder handles any number of aircraft, a Sparse Cognitive MoE head stabilises ATC-style
instructions, and a Kinematic Safety Shield overrides unsafe instructions.

Status: planned — not implemented yet (issue #16). ``icml26 info sarl`` shows the card and its claims.
"""
