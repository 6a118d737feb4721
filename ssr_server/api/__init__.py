"""The HTTP edge: the app factory and its middleware (``app``), the REST agent API (``rest``), the
OpenAI-compatible API (``openai``), the probes and metrics (``ops``), admission, shutdown and the one
error mapping. Pydantic validates input here and nowhere deeper."""
