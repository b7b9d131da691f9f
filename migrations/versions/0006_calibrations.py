"""Probe calibrations collected by workers (`semjobs probe collect --submit`): the
calibration's settings, one row per question (the unit of work), one per prefix (the files
`semspec.calibration.store` writes, as bytes).

Revision ID: 0006_calibrations
Revises: 0005_step_reason
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_calibrations"
down_revision = "0005_step_reason"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "calibrations",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "calibration_questions",
        sa.Column("calibration_id", sa.String(32), sa.ForeignKey("calibrations.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("question_id", sa.String(512), primary_key=True),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("trace", sa.JSON(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("finished_at", TS, nullable=True),
    )
    op.create_table(
        "calibration_prefixes",
        sa.Column("calibration_id", sa.String(32), sa.ForeignKey("calibrations.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("key", sa.String(600), primary_key=True),
        sa.Column("question_id", sa.String(512), nullable=False),
        sa.Column("record", sa.LargeBinary(), nullable=False),
        sa.Column("features", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("calibration_prefixes")
    op.drop_table("calibration_questions")
    op.drop_table("calibrations")
