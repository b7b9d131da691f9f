"""Initial schema: jobs, items, outputs, step_log, item_stats.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("method", sa.String(32), nullable=False),
        sa.Column("input_format", sa.String(16), nullable=False),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("n_items", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("manifest", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])

    op.create_table(
        "items",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.String(512), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.UniqueConstraint("job_id", "item_id", name="uq_items_job_item"),
        sa.UniqueConstraint("job_id", "seq", name="uq_items_job_seq"),
    )
    op.create_index("ix_items_job_status", "items", ["job_id", "status"])

    op.create_table(
        "outputs",
        sa.Column(
            "item_pk", BigId, sa.ForeignKey("items.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column(
            "job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("final_answer", sa.Text(), nullable=True),
        sa.Column("finish_reason", sa.String(16), nullable=False),
        sa.Column("models", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_outputs_job_id", "outputs", ["job_id"])

    op.create_table(
        "step_log",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "item_pk", BigId, sa.ForeignKey("items.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("author", sa.String(16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("drafted_tokens", sa.Integer(), nullable=False),
        sa.Column("accepted_tokens", sa.Integer(), nullable=False),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("p_target", sa.Float(), nullable=True),
        sa.Column("p_draft", sa.Float(), nullable=True),
        sa.Column("accept_prob", sa.Float(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.UniqueConstraint("item_pk", "step_index", name="uq_step_log_item_step"),
    )
    op.create_index("ix_step_log_job_id", "step_log", ["job_id"])

    op.create_table(
        "item_stats",
        sa.Column(
            "item_pk", BigId, sa.ForeignKey("items.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column(
            "job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("wall_seconds", sa.Float(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("generated_tokens", sa.Integer(), nullable=False),
        sa.Column("target_forward_passes", sa.Integer(), nullable=False),
        sa.Column("draft_forward_passes", sa.Integer(), nullable=False),
        sa.Column("drafted_tokens", sa.Integer(), nullable=False),
        sa.Column("accepted_tokens", sa.Integer(), nullable=False),
        sa.Column("steps_drafted", sa.Integer(), nullable=False),
        sa.Column("steps_accepted", sa.Integer(), nullable=False),
        sa.Column("n_steps", sa.Integer(), nullable=False),
        sa.Column("phase_seconds", sa.JSON(), nullable=False),
    )
    op.create_index("ix_item_stats_job_id", "item_stats", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_item_stats_job_id", table_name="item_stats")
    op.drop_table("item_stats")
    op.drop_index("ix_step_log_job_id", table_name="step_log")
    op.drop_table("step_log")
    op.drop_index("ix_outputs_job_id", table_name="outputs")
    op.drop_table("outputs")
    op.drop_index("ix_items_job_status", table_name="items")
    op.drop_table("items")
    op.drop_index("ix_jobs_status", table_name="jobs")
    op.drop_table("jobs")
