"""Tools the agent can call: zoom, text search, image search."""
