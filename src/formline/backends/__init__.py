"""Inference backends (llama.cpp, transformers) behind one small contract."""

from formline.backends.base import (
    Backend,
    BackendError,
    Generation,
    Sampling,
    default_model_path,
    load_backend,
)

__all__ = [
    "Backend",
    "BackendError",
    "Generation",
    "Sampling",
    "default_model_path",
    "load_backend",
]
