"""STAND-IN for vLLM 0.16 package `vllm.v1.core` (tests only; not vLLM)."""
