"""token revocations: bearer tokens and dashboard sessions cut off by their id before they expire

Every token and dashboard session carries a random id (``jti``). An admin (``POST
/v1/admin/tokens/revocations`` or ``privrec revoke-token``) or a sign-out adds the id here with the
token's expiry; API processes refuse listed ids and reload the list at least every few seconds.
Rows whose ``expires_at`` has passed name tokens refused anyway and may be pruned.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('revoked_tokens',
    sa.Column('jti', sa.String(length=64), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('reason', sa.String(length=500), nullable=True),
    sa.PrimaryKeyConstraint('jti', name=op.f('pk_revoked_tokens'))
    )
    op.create_index(op.f('ix_revoked_tokens_expires_at'), 'revoked_tokens', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_revoked_tokens_expires_at'), table_name='revoked_tokens')
    op.drop_table('revoked_tokens')
