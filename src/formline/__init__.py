"""formline: language-model output that is valid by construction."""

__version__ = "0.1.0"
