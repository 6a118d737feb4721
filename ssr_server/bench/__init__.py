"""Benchmarks that measure the engine's figures side by side in one run (``ssr-server bench ...``)."""
