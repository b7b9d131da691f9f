"""Several samples per input and checked answers: items.sample (0-based; an input's id is
unique per sample, not per job), and on outputs the trace split into reasoning and content
and `correct` (the final answer against the input's reference; NULL without one).

Revision ID: 0004_samples_and_answers
Revises: 0003_worker_heartbeats
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_samples_and_answers"
down_revision = "0003_worker_heartbeats"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite (the embedded database) cannot change constraints in place.
    with op.batch_alter_table("items") as t:
        t.add_column(sa.Column("sample", sa.Integer(), nullable=False, server_default="0"))
        t.drop_constraint("uq_items_job_item", type_="unique")
        t.create_unique_constraint("uq_items_job_item_sample", ["job_id", "item_id", "sample"])
    with op.batch_alter_table("outputs") as t:
        t.add_column(sa.Column("reasoning", sa.Text(), nullable=True))
        t.add_column(sa.Column("content", sa.Text(), nullable=True))
        t.add_column(sa.Column("correct", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outputs") as t:
        t.drop_column("correct")
        t.drop_column("content")
        t.drop_column("reasoning")
    # only possible while every input has one sample
    with op.batch_alter_table("items") as t:
        t.drop_constraint("uq_items_job_item_sample", type_="unique")
        t.create_unique_constraint("uq_items_job_item", ["job_id", "item_id"])
        t.drop_column("sample")
