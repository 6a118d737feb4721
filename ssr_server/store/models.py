"""The run store's tables (SQLAlchemy 2 declarative). The schema itself is created and changed only by the
Alembic migrations in ``migrations/``; these classes must match the latest one (a test compares them)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    library: Mapped[str] = mapped_column(String(200))
    question: Mapped[str] = mapped_column(Text)
    outcome: Mapped[str | None] = mapped_column(String(32))
    answer: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    background: Mapped[bool] = mapped_column(Boolean, default=False)
    owner: Mapped[str | None] = mapped_column(String(64))  # the server instance running it
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    total_s: Mapped[float | None] = mapped_column(Float)
    model_s: Mapped[float | None] = mapped_column(Float)
    tool_s: Mapped[float | None] = mapped_column(Float)
    n_turns: Mapped[int] = mapped_column(Integer, default=0)
    n_images: Mapped[int] = mapped_column(Integer, default=0)
    options: Mapped[dict[str, Any]] = mapped_column(JSON)
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    __table_args__ = (
        Index("ix_runs_created", "created_at", "id"),  # the list's order and cursor
        Index("ix_runs_status", "status"),
        Index("ix_runs_owner", "owner"),
    )


class TurnRow(Base):
    __tablename__ = "run_turns"

    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id", ondelete="CASCADE"),
                                        primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class ImageRow(Base):
    __tablename__ = "run_images"

    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id", ondelete="CASCADE"),
                                        primary_key=True)
    n: Mapped[int] = mapped_column(Integer, primary_key=True)  # the run's image number, as the model saw it
    media_type: Mapped[str] = mapped_column(String(32))
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16))
    parent: Mapped[int | None] = mapped_column(Integer)
    box: Mapped[list[int] | None] = mapped_column(JSON)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class ServerRow(Base):
    """A live server instance using the store: its runs in flight are its own until it stops beating."""

    __tablename__ = "run_servers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    seen_at: Mapped[float] = mapped_column(Float)
