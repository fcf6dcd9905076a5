"""distill: run, track, diagnose and archive LLM distillation experiments."""

__version__ = "0.1.0"
