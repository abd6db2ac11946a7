"""data sets carry a retrain policy: interval, epsilon per run, the minimum of payable blocks, whether
scheduled runs read the still-open current block

Every column is NULL for the deployment's setting (RETRAIN_INTERVAL_S, RETRAIN_EPSILON,
RETRAIN_MIN_PAYABLE_BLOCKS, RETRAIN_READ_CURRENT_BLOCK), so existing data sets keep today's schedule.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

_CHECKS = (
    ('retrain_interval_positive', 'retrain_interval_s IS NULL OR retrain_interval_s > 0'),
    ('retrain_epsilon_positive', 'retrain_epsilon IS NULL OR retrain_epsilon > 0'),
    ('retrain_min_payable_blocks_positive', 'retrain_min_payable_blocks IS NULL OR retrain_min_payable_blocks > 0'),
)


def upgrade() -> None:
    with op.batch_alter_table('datasets') as batch:
        batch.add_column(sa.Column('retrain_interval_s', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('retrain_epsilon', sa.Float(), nullable=True))
        batch.add_column(sa.Column('retrain_min_payable_blocks', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('retrain_read_current_block', sa.Boolean(), nullable=True))
        for name, condition in _CHECKS:
            batch.create_check_constraint(name, condition)


def downgrade() -> None:
    with op.batch_alter_table('datasets') as batch:
        for name, _ in _CHECKS:
            batch.drop_constraint(op.f(f'ck_datasets_{name}'), type_='check')
        for column in ('retrain_read_current_block', 'retrain_min_payable_blocks', 'retrain_epsilon',
                       'retrain_interval_s'):
            batch.drop_column(column)
