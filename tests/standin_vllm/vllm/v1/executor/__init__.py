"""STAND-IN for vLLM 0.16 package `vllm.v1.executor` (tests only; not vLLM)."""
