"""The REST agent API: whole runs (plain or streamed), one selection step, the libraries.

``protocol`` holds the pydantic models, ``serving`` the work, ``router`` the path operations that join
them; each imports only those after it.
"""
