"""Summaries: stored summaries of a conversation's older messages.

``memstore_summaries`` holds one row per summary made by ``store.summarize``,
keyed by ``(conversation_id, number)`` like every hot table is keyed by the
conversation id. Deleting a conversation deletes its summaries.

Revision ID: 0003_summaries
Revises: 0002_conversation_epoch
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_summaries"
down_revision: str | None = "0002_conversation_epoch"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "memstore_summaries",
        sa.Column("conversation_id", sa.String(255), nullable=False),
        sa.Column("number", sa.BigInteger(), nullable=False),
        sa.Column("first_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("token_counter", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("number >= 1", name=op.f("ck_memstore_summaries_number_positive")),
        sa.CheckConstraint(
            "first_seq >= 1", name=op.f("ck_memstore_summaries_first_seq_positive")
        ),
        sa.CheckConstraint(
            "last_seq >= first_seq", name=op.f("ck_memstore_summaries_seq_range")
        ),
        sa.CheckConstraint(
            "token_count >= 0", name=op.f("ck_memstore_summaries_token_count_nonnegative")
        ),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["memstore_conversations.id"],
            name=op.f("fk_memstore_summaries_conversation_id_memstore_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("conversation_id", "number", name=op.f("pk_memstore_summaries")),
    )


def downgrade() -> None:
    op.drop_table("memstore_summaries")
