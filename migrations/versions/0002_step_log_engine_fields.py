"""step_log: the StepRecord fields the first schema did not keep (target_tokens, draft_text,
judge_score). Nullable: rows written before this revision have no value for them.

Revision ID: 0002_step_log_engine_fields
Revises: 0001_initial
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_step_log_engine_fields"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite (the embedded database) cannot drop columns in place on downgrade.
    with op.batch_alter_table("step_log") as t:
        t.add_column(sa.Column("target_tokens", sa.Integer(), nullable=True))
        t.add_column(sa.Column("draft_text", sa.Text(), nullable=True))
        t.add_column(sa.Column("judge_score", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_log") as t:
        t.drop_column("judge_score")
        t.drop_column("draft_text")
        t.drop_column("target_tokens")
