"""ratings keyed by (user, data set, item): the surrogate id and its sequence go

Nothing reads ``ratings.id``; the unique (user, data set, item) key becomes the primary key, so
an upserted rating costs one B-tree insert and no sequence value (issue 13, bulk ingest).

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-24
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0005'
branch_labels = None
depends_on = None

_KEY = ['user_id', 'dataset_id', 'item_id']


def upgrade() -> None:
    with op.batch_alter_table('ratings', schema=None) as batch_op:
        batch_op.drop_constraint('pk_ratings', type_='primary')
        batch_op.drop_column('id')
        batch_op.drop_constraint('uq_ratings_user_dataset_item', type_='unique')
        batch_op.create_primary_key('pk_ratings', _KEY)


def downgrade() -> None:
    with op.batch_alter_table('ratings', schema=None) as batch_op:
        batch_op.drop_constraint('pk_ratings', type_='primary')
        batch_op.create_unique_constraint('uq_ratings_user_dataset_item', _KEY)
    if op.get_bind().dialect.name == 'postgresql':  # numbers the existing rows from its own sequence
        op.execute('ALTER TABLE ratings ADD COLUMN id BIGSERIAL')
        op.create_primary_key('pk_ratings', 'ratings', ['id'])
        return
    with op.batch_alter_table('ratings', schema=None, recreate='always') as batch_op:
        batch_op.add_column(sa.Column('id', sa.Integer(), nullable=False))
        batch_op.create_primary_key('pk_ratings', ['id'])
