"""STAND-IN for vLLM 0.16 package `vllm.model_executor.models` (tests only; not vLLM)."""
