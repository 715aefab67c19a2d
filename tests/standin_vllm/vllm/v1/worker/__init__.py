"""STAND-IN for vLLM 0.16 package `vllm.v1.worker` (tests only; not vLLM)."""
