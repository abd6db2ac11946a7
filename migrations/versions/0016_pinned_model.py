"""a rollback sticks: a data set's active model version can be pinned

``model_pinned`` true: the active version was chosen by an admin (activation) and stays active until
the admin unpins it; runs still publish their versions, inactive. False for every existing data set
(today's behaviour: each publication activates its version).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('datasets') as batch:
        batch.add_column(sa.Column('model_pinned', sa.Boolean(), nullable=False, server_default=sa.text('false')))


def downgrade() -> None:
    with op.batch_alter_table('datasets') as batch:
        batch.drop_column('model_pinned')
