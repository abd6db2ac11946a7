"""bulk ingest: ratings without per-row foreign-key triggers, striped ratings_version counters

The ratings table's three foreign keys (data set, user, item) become set-based checks in the
ingest service (issue 13): ``FOR KEY SHARE`` locks on the referenced rows in the writing
transaction, ``FOR UPDATE`` on the user row before ``delete_user`` removes the user's ratings.
Its unique key leads with the user (serving a user's ratings and their deletion), replacing the
(data set, user, item) key and the user and item indexes: two B-tree inserts per rating, not four.
``ratings_version_shards`` lets concurrent rating writes bump the data set's version without
queueing on its row lock.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

_FOREIGN_KEYS = (
    ('fk_ratings_dataset_id_datasets', 'datasets', 'dataset_id'),
    ('fk_ratings_item_id_items', 'items', 'item_id'),
    ('fk_ratings_user_id_users', 'users', 'user_id'),
)


def upgrade() -> None:
    op.create_table('ratings_version_shards',
    sa.Column('dataset_id', sa.Integer(), nullable=False),
    sa.Column('shard', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('n', sa.BigInteger(), nullable=False),
    sa.Column('changed_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_ratings_version_shards_dataset_id_datasets'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('dataset_id', 'shard', name=op.f('pk_ratings_version_shards'))
    )
    with op.batch_alter_table('ratings', schema=None) as batch_op:
        for name, _, _ in _FOREIGN_KEYS:
            batch_op.drop_constraint(batch_op.f(name), type_='foreignkey')
        # one user-first unique key instead of the (data set, user, item) key and two indexes
        batch_op.drop_index('ix_ratings_item')
        batch_op.drop_index('ix_ratings_user')
        batch_op.drop_constraint('uq_ratings_dataset_user_item', type_='unique')
        batch_op.create_unique_constraint('uq_ratings_user_dataset_item', ['user_id', 'dataset_id', 'item_id'])


def downgrade() -> None:
    # fold the shards back into the data sets' own counters, drop orphans the FKs would refuse
    op.execute("UPDATE datasets SET ratings_version = ratings_version + COALESCE("
               "(SELECT SUM(n) FROM ratings_version_shards s WHERE s.dataset_id = datasets.id), 0)")
    for _, table, column in _FOREIGN_KEYS:
        op.execute(f"DELETE FROM ratings WHERE {column} NOT IN (SELECT id FROM {table})")
    with op.batch_alter_table('ratings', schema=None) as batch_op:
        batch_op.drop_constraint('uq_ratings_user_dataset_item', type_='unique')
        batch_op.create_unique_constraint('uq_ratings_dataset_user_item', ['dataset_id', 'user_id', 'item_id'])
        batch_op.create_index('ix_ratings_user', ['user_id'], unique=False)
        batch_op.create_index('ix_ratings_item', ['item_id'], unique=False)
        for name, table, column in _FOREIGN_KEYS:
            batch_op.create_foreign_key(batch_op.f(name), table, [column], ['id'], ondelete='CASCADE')
    op.drop_table('ratings_version_shards')
