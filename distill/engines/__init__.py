"""Engines: the `Engine` protocol (base.py) and its implementations: hf (transformers, in this
process), server (a vLLM server over HTTP), vllm (TRL's vLLM rollouts for the student)."""
