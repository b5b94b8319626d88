"""Inference backends (llama.cpp, transformers) behind one small engine contract."""

from formline.backends.base import Backend, BackendError, default_model_path, load_backend

__all__ = ["Backend", "BackendError", "default_model_path", "load_backend"]
