"""Evaluation: metrics (avg@k, pass@k, solved) and the single-turn runner."""
