"""step_log.reason: why the target wrote a step no draft was tried for (a back-off of the
adaptive speculation, the answer after the end-of-thinking marker, no room in a context, the
draft stopping at once). NULL on other steps and on rows written before it.

Revision ID: 0005_step_reason
Revises: 0004_samples_and_answers
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_step_reason"
down_revision = "0004_samples_and_answers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("step_log") as t:
        t.add_column(sa.Column("reason", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_log") as t:
        t.drop_column("reason")
