"""service privacy: declared data set kind and user bound, private_data_read, run outbox

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-28

* ``training_runs.output_persisted`` is renamed ``private_data_read``: it is set before the
  worker reads private data and means "charged, never refunded" (a vanished worker's run too).
* ``training_runs.enqueued_at``: the outbox mark (None: the message never reached the broker).
* ``datasets.kind`` ("ratings" | "votes", public, declared) and ``datasets.max_users`` (public
  admin-declared bound on the number of users). Existing data sets get their kind from public
  facts only: "votes" when votes are randomised at ingestion or the active model is one-bit.
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.alter_column('output_persisted', new_column_name='private_data_read',
                              existing_type=sa.Boolean(), existing_nullable=False,
                              existing_server_default=sa.text('false'))
        batch_op.add_column(sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True))

    with op.batch_alter_table('datasets', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kind', sa.String(length=16), server_default='ratings', nullable=False))
        batch_op.add_column(sa.Column('max_users', sa.Integer(), nullable=True))
        batch_op.create_check_constraint('kind_kind', "kind IN ('ratings', 'votes')")
        batch_op.create_check_constraint('max_users_positive', 'max_users IS NULL OR max_users > 0')

    # runs created before the outbox were sent when they were created
    op.execute("UPDATE training_runs SET enqueued_at = created_at")
    op.execute(
        "UPDATE datasets SET kind = 'votes' WHERE vote_local_epsilon IS NOT NULL OR id IN "
        "(SELECT dataset_id FROM model_versions WHERE active AND algorithm = 'onebit')"
    )


def downgrade() -> None:
    with op.batch_alter_table('datasets', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_datasets_max_users_positive'), type_='check')
        batch_op.drop_constraint(op.f('ck_datasets_kind_kind'), type_='check')
        batch_op.drop_column('max_users')
        batch_op.drop_column('kind')

    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.drop_column('enqueued_at')
        batch_op.alter_column('private_data_read', new_column_name='output_persisted',
                              existing_type=sa.Boolean(), existing_nullable=False,
                              existing_server_default=sa.text('false'))
