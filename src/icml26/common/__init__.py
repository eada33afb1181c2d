"""What several papers share: results, seeding and environment metadata, progress, plotting, optional deps.

Modules (import them directly; nothing here imports torch at import time):

- ``results``  — the one result format (per-seed runs, mean ± std, JSON written atomically, Markdown).
- ``claims``   — the small check language of the paper cards, evaluated over seeds.
- ``repro``    — ``seed_everything``, thread setting, environment metadata.
- ``progress`` — tqdm bars that stay silent when output is not a terminal.
- ``plotting`` — matplotlib on the Agg backend, figures saved atomically as PNG.
- ``optional`` — ``requires("flwr", extra="fl")``: optional dependencies found, not assumed.
- ``io``       — atomic file writes shared by the modules above.
"""
