"""Evaluation: pass@k / maj@k sampling runs, their settings, the entropy-coverage frontier."""
