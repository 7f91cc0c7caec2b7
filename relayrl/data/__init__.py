"""Prompt data: files, rendering, sampling order, and the built-in toy task."""
