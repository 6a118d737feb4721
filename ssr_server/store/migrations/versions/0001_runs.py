"""The run store's first schema: runs, their turns and images, the live server instances.

Revision ID: 0001
Revises:
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("library", sa.String(200), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(32)),
        sa.Column("answer", sa.Text()),
        sa.Column("error", sa.Text()),
        sa.Column("background", sa.Boolean(), nullable=False),
        sa.Column("owner", sa.String(64)),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float()),
        sa.Column("finished_at", sa.Float()),
        sa.Column("total_s", sa.Float()),
        sa.Column("model_s", sa.Float()),
        sa.Column("tool_s", sa.Float()),
        sa.Column("n_turns", sa.Integer(), nullable=False),
        sa.Column("n_images", sa.Integer(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("usage", sa.JSON()),
    )
    op.create_index("ix_runs_created", "runs", ["created_at", "id"])
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_index("ix_runs_owner", "runs", ["owner"])
    op.create_table(
        "run_turns",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("idx", sa.Integer(), primary_key=True),
        sa.Column("data", sa.JSON(), nullable=False),
    )
    op.create_table(
        "run_images",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("n", sa.Integer(), primary_key=True),
        sa.Column("media_type", sa.String(32), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("parent", sa.Integer()),
        sa.Column("box", sa.JSON()),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    op.create_table(
        "run_servers",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("seen_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_servers")
    op.drop_table("run_images")
    op.drop_table("run_turns")
    op.drop_index("ix_runs_owner", "runs")
    op.drop_index("ix_runs_status", "runs")
    op.drop_index("ix_runs_created", "runs")
    op.drop_table("runs")
