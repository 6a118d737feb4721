"""The stored runs' API: background runs, retrieval by id, live events, listing, cancel, delete, images,
and the run viewer's page (``/ui``).

``protocol`` holds the pydantic models, ``serving`` the work (a stored run's recording included, which
``api.rest`` uses for ``POST /v1/agent/runs``), ``router`` the path operations; each imports only those
after it.
"""
