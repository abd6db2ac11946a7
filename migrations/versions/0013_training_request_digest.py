"""training runs remember their request's digest: an idempotency key replayed with another body is refused

``request_digest`` is the SHA-256 (hex) of the request's actor and body. A replay of a key whose run
has another digest is 409 ``idempotency_key_reused``; a manual request without a key is matched to
the same actor's identical request of the last minute by a key derived from the digest. NULL for
runs recorded before this revision (their replays are not compared).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('training_runs') as batch:
        batch.add_column(sa.Column('request_digest', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('training_runs') as batch:
        batch.drop_column('request_digest')
