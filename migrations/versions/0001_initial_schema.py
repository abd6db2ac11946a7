"""Initial schema: data sets, users, items, ratings, training runs, model versions, budget, ledger.

Revision ID: 0001
Revises: 
Create Date: 2026-11-21
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('datasets',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('description', sa.Text(), nullable=True),
    sa.Column('rating_min', sa.Float(), nullable=False),
    sa.Column('rating_max', sa.Float(), nullable=False),
    sa.Column('ratings_version', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('ratings_changed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('rating_min < rating_max', name=op.f('ck_datasets_rating_range')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_datasets')),
    sa.UniqueConstraint('name', name=op.f('uq_datasets_name'))
    )
    op.create_table('users',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('external_id', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users')),
    sa.UniqueConstraint('external_id', name=op.f('uq_users_external_id'))
    )
    op.create_table('budget_accounts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('dataset_id', sa.Integer(), nullable=False),
    sa.Column('epsilon_cap', sa.Float(), nullable=False),
    sa.Column('delta', sa.Float(), nullable=False),
    sa.Column('accountant', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("accountant IN ('rdp', 'pld')", name=op.f('ck_budget_accounts_accountant_kind')),
    sa.CheckConstraint('delta > 0 AND delta < 1', name=op.f('ck_budget_accounts_delta_range')),
    sa.CheckConstraint('epsilon_cap > 0', name=op.f('ck_budget_accounts_cap_positive')),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_budget_accounts_dataset_id_datasets'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_budget_accounts')),
    sa.UniqueConstraint('dataset_id', name=op.f('uq_budget_accounts_dataset_id'))
    )
    op.create_table('items',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('dataset_id', sa.Integer(), nullable=False),
    sa.Column('external_id', sa.String(length=128), nullable=False),
    sa.Column('title', sa.String(length=512), nullable=True),
    sa.Column('categories', sa.JSON(), nullable=False),
    sa.Column('features', sa.JSON(), nullable=False),
    sa.Column('active', sa.Boolean(), server_default=sa.text('(true)'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_items_dataset_id_datasets'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_items')),
    sa.UniqueConstraint('dataset_id', 'external_id', name='uq_items_dataset_external')
    )
    op.create_table('training_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('dataset_id', sa.Integer(), nullable=False),
    sa.Column('algorithm', sa.String(length=32), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('requested_epsilon', sa.Float(), nullable=False),
    sa.Column('delta', sa.Float(), nullable=False),
    sa.Column('epsilon_charged', sa.Float(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('progress', sa.Float(), nullable=False),
    sa.Column('stage', sa.String(length=64), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('trigger', sa.String(length=16), nullable=False),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('idempotency_key', sa.String(length=128), nullable=True),
    sa.Column('ratings_version', sa.BigInteger(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('worker', sa.String(length=128), nullable=True),
    sa.Column('output_persisted', sa.Boolean(), server_default=sa.text('(false)'), nullable=False),
    sa.Column('refunded', sa.Boolean(), server_default=sa.text('(false)'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed')", name=op.f('ck_training_runs_status_kind')),
    sa.CheckConstraint('progress >= 0 AND progress <= 1', name=op.f('ck_training_runs_progress_range')),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_training_runs_dataset_id_datasets'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_training_runs')),
    sa.UniqueConstraint('dataset_id', 'idempotency_key', name='uq_training_runs_idempotency')
    )
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.create_index('ix_training_runs_dataset_status', ['dataset_id', 'status'], unique=False)

    op.create_table('ledger_entries',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('event', sa.JSON(), nullable=True),
    sa.Column('parameters', sa.JSON(), nullable=False),
    sa.Column('epsilon', sa.Float(), nullable=True),
    sa.Column('spent_rdp', sa.Float(), nullable=False),
    sa.Column('spent_pld', sa.Float(), nullable=True),
    sa.Column('epsilon_cap', sa.Float(), nullable=False),
    sa.Column('delta', sa.Float(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.String(length=40), nullable=False),
    sa.Column('prev_hash', sa.String(length=64), nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.CheckConstraint("kind IN ('open', 'reservation', 'commit', 'refund', 'cap_change')", name=op.f('ck_ledger_entries_kind_kind')),
    sa.ForeignKeyConstraint(['account_id'], ['budget_accounts.id'], name=op.f('fk_ledger_entries_account_id_budget_accounts'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['run_id'], ['training_runs.id'], name=op.f('fk_ledger_entries_run_id_training_runs'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ledger_entries')),
    sa.UniqueConstraint('account_id', 'seq', name='uq_ledger_entries_account_seq'),
    sa.UniqueConstraint('hash', name=op.f('uq_ledger_entries_hash')),
    sa.UniqueConstraint('run_id', 'kind', name='uq_ledger_entries_run_kind')
    )
    op.create_table('model_versions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('dataset_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('algorithm', sa.String(length=32), nullable=False),
    sa.Column('artifact_path', sa.String(length=1024), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('epsilon', sa.Float(), nullable=False),
    sa.Column('epsilon_pld', sa.Float(), nullable=True),
    sa.Column('delta', sa.Float(), nullable=False),
    sa.Column('n_items', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('metadata', sa.JSON(), nullable=False),
    sa.Column('active', sa.Boolean(), server_default=sa.text('(false)'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('activated_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_model_versions_dataset_id_datasets'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['run_id'], ['training_runs.id'], name=op.f('fk_model_versions_run_id_training_runs'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_model_versions')),
    sa.UniqueConstraint('run_id', name=op.f('uq_model_versions_run_id'))
    )
    with op.batch_alter_table('model_versions', schema=None) as batch_op:
        batch_op.create_index('uq_model_versions_one_active', ['dataset_id'], unique=True, postgresql_where=sa.text('active'), sqlite_where=sa.text('active'))

    op.create_table('ratings',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('dataset_id', sa.Integer(), nullable=False),
    sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('item_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_ratings_dataset_id_datasets'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['item_id'], ['items.id'], name=op.f('fk_ratings_item_id_items'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_ratings_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ratings')),
    sa.UniqueConstraint('dataset_id', 'user_id', 'item_id', name='uq_ratings_dataset_user_item')
    )
    with op.batch_alter_table('ratings', schema=None) as batch_op:
        batch_op.create_index('ix_ratings_item', ['item_id'], unique=False)
        batch_op.create_index('ix_ratings_user', ['user_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('ratings', schema=None) as batch_op:
        batch_op.drop_index('ix_ratings_user')
        batch_op.drop_index('ix_ratings_item')

    op.drop_table('ratings')
    with op.batch_alter_table('model_versions', schema=None) as batch_op:
        batch_op.drop_index('uq_model_versions_one_active', postgresql_where=sa.text('active'), sqlite_where=sa.text('active'))

    op.drop_table('model_versions')
    op.drop_table('ledger_entries')
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_training_runs_dataset_status')

    op.drop_table('training_runs')
    op.drop_table('items')
    op.drop_table('budget_accounts')
    op.drop_table('users')
    op.drop_table('datasets')
