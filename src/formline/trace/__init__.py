"""Trace pages: record what the mask did on a real model and explain it in six steps."""

from formline.trace.html import render_trace_html, write_trace_html
from formline.trace.recorder import classify, load_trace_backend, record_trace

__all__ = [
    "classify",
    "load_trace_backend",
    "record_trace",
    "render_trace_html",
    "write_trace_html",
]
