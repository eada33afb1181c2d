"""Training-free token-level watermarking of synthetic audio with a reduced vocabulary.

Paper: "Hidden in Plain Tokens: Simply Robust, Gradient-Free Watermark for Synthetic Audio", ICML 2026. https://arxiv.org/abs/2605.25967

A KGW green-list watermark for audio-token language models whose green lists and hashes live on clusters of
codec tokens: clusters are communities (Leiden) of the codec's own decode/re-encode confusion graph, so the
watermark survives re-tokenisation and audio edits without fine-tuning the tokenizer.

Status: planned — not implemented yet (issue #10). ``icml26 info audio_watermark`` shows the card and its claims.
"""
