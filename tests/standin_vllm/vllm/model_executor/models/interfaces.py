"""STAND-IN for vLLM 0.16 `vllm.model_executor.models.interfaces` (tests only).

Follows model_executor/models/interfaces.py:1283 (SupportsEagle3, a runtime-checkable
protocol flagged by `supports_eagle3 = True`) and :1327 (supports_eagle3 = isinstance).
"""

from __future__ import annotations

from typing import Any


def supports_eagle3(model: Any) -> bool:
    return getattr(model, "supports_eagle3", False) is True
