"""STAND-IN for vLLM 0.16 package `vllm.v1.core.sched` (tests only; not vLLM)."""
