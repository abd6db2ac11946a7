"""per-data-set model version numbers

Revision ID: 0006
Revises: 0002
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('model_versions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('version', sa.Integer(), nullable=True))
    # number existing versions 1, 2, ... per data set in publication (id) order
    op.execute(
        "UPDATE model_versions SET version = (SELECT count(*) FROM model_versions AS older "
        "WHERE older.dataset_id = model_versions.dataset_id AND older.id <= model_versions.id)"
    )
    with op.batch_alter_table('model_versions', schema=None) as batch_op:
        batch_op.alter_column('version', existing_type=sa.Integer(), nullable=False)
        batch_op.create_unique_constraint('uq_model_versions_dataset_id_version', ['dataset_id', 'version'])


def downgrade() -> None:
    with op.batch_alter_table('model_versions', schema=None) as batch_op:
        batch_op.drop_constraint('uq_model_versions_dataset_id_version', type_='unique')
        batch_op.drop_column('version')
