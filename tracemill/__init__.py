"""Tracemill: make LLM agents better from their own production traces."""

__version__ = "0.1.0"
