"""privacy units: a data set and a person budget declare theirs at creation (``user`` or ``user_period``)

``datasets.privacy_unit`` and ``person_budgets.privacy_unit`` (``user`` for every existing row: a user
with all of her data, blocks keyed by her cohort, as 0012 made them). A ``user_period`` data set's
blocks are keyed by the calendar period of each rating's creation (``ratings.created_at``, written when
the rating is first inserted and kept by every update), so no rating column is added. A person budget
holds data sets of its own unit only; the unit never changes afterwards.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

_UNITS = "privacy_unit IN ('user', 'user_period')"


def upgrade() -> None:
    for table in ('datasets', 'person_budgets'):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column('privacy_unit', sa.String(length=16), nullable=False, server_default='user'))
            batch.create_check_constraint(op.f(f'ck_{table}_privacy_unit_kind'), _UNITS)


def downgrade() -> None:
    for table in ('person_budgets', 'datasets'):
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f'ck_{table}_privacy_unit_kind'), type_='check')
            batch.drop_column('privacy_unit')
