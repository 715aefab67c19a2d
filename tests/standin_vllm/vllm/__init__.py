"""STAND-IN for vLLM 0.16 (tests only; not vLLM). See tests/standin_vllm/README.md.

Only the modules and names that speculators 0.3.0's hidden-states generator and
custom worker import exist here, with vLLM 0.16.0 signatures and failure behaviour.
"""

__version__ = "0.16.0+standin"
