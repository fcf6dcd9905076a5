"""Reproducibility: the run manifest (and, later, DVC-managed checkpoints and data)."""
