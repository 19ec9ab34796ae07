"""KV-cache generation for DecLLM and RedLLM (docs/architecture.md "Generation")."""
from __future__ import annotations

from t5like.inference.generation import Generator, generate
from t5like.inference.sampling import SamplingConfig

__all__ = ["Generator", "SamplingConfig", "generate"]
