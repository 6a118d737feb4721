"""ssr-server: an inference server for small multimodal search agents that reason by selection."""

__version__ = "0.1.0"
