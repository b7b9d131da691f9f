"""outputs.kept: whether the sample is one its dataset keeps (semspec.answers.is_kept), so
a job that wants K kept samples of an input counts them in one query; item_stats.cut_tokens:
tokens generated but not in the output (a loop cut at its onset, a sample aborted once its
input had enough kept ones). NULL kept and 0 cut on rows written before it.

Revision ID: 0007_kept_samples
Revises: 0006_calibrations
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_kept_samples"
down_revision = "0006_calibrations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outputs") as t:
        t.add_column(sa.Column("kept", sa.Boolean(), nullable=True))
    with op.batch_alter_table("item_stats") as t:
        t.add_column(sa.Column("cut_tokens", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("item_stats") as t:
        t.drop_column("cut_tokens")
    with op.batch_alter_table("outputs") as t:
        t.drop_column("kept")
