"""The HTTP edge: FastAPI app factory, routes, schemas, safe image intake and error mapping."""
