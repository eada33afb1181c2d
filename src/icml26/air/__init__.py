"""AIR: incident response for LLM agent systems.

Paper: "AIR: Improving Agent Safety through Incident Response", ICML 2026 (poster 62353). https://arxiv.org/abs/2602.11749

A declarative rule language for the incident-response lifecycle of LLM agents, run inside the agent loop:
detect incidents from the environment state and recent context, contain them, recover through the agent's own
tools and verify the recovery on the state, then synthesise guardrail rules that block similar incidents.

Status: planned — not implemented yet (issue #3). ``icml26 info air`` shows the card and its claims.
"""
