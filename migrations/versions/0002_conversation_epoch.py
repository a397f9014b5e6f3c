"""Conversation epoch: validates the process-local cache of decoded rows.

``memstore_conversations.epoch`` is a random token that memstore replaces whenever
a conversation's stored messages change other than by appending (a score, a pin,
``pop``, ``truncate``, ``clear``, a replaced state). Existing conversations start
at 0; any later change of that kind gives them a random one.

Revision ID: 0002_conversation_epoch
Revises: 0001_initial
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_conversation_epoch"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant server default: on PostgreSQL 11+ and SQLite, adding the column
    # rewrites no rows.
    op.add_column(
        "memstore_conversations",
        sa.Column("epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    # SQLite 3.35+ drops a column in place (no table copy: the messages' foreign key
    # to this table is never touched).
    op.drop_column("memstore_conversations", "epoch")
