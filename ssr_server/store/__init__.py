"""The run store: every run on record, behind one interface (``base.RunStore``), on SQLite (the embedded
default, a file under the cache dir) or PostgreSQL (several replicas sharing one store).

``records`` holds the dataclasses the rest of the server sees, ``models`` the tables (SQLAlchemy 2),
``sql`` the one implementation of the interface on both databases, ``backends`` how a setting becomes an
open store (migrated by Alembic, ``migrate``), ``images`` what is kept of an image, ``export`` the
training-data lines of stored runs.
"""
