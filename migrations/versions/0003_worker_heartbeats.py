"""workers: one heartbeat row per process that runs tasks, and an index on items.worker, so
the items held by a worker that stopped beating (SIGKILL, preempted node) are found and
re-enqueued in seconds instead of after the broker's visibility timeout.

Revision ID: 0003_worker_heartbeats
Revises: 0002_step_log_engine_fields
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_worker_heartbeats"
down_revision = "0002_step_log_engine_fields"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("heartbeat_at", TS, nullable=False),
    )
    op.create_index("ix_items_worker", "items", ["worker"])


def downgrade() -> None:
    op.drop_index("ix_items_worker", table_name="items")
    op.drop_table("workers")
