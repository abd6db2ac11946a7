"""reference epoch: one number that changes whenever users, items or data sets are deleted

Rating writers cache external id -> row id maps of users and items per process (issue 13, bulk
ingest); a cached id is used only while ``reference_epoch.n`` is the value it was cached under.
Statement-level triggers (PostgreSQL) add one to it in any transaction that deletes, truncates or
re-keys (id, external id, data set) rows of ``users``, ``items`` or ``datasets``. It starts at a
random number, so a database created again under the same URL does not reuse old values.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""
import secrets

from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

# table -> the columns whose change re-keys a row
_WATCHED = {'users': 'id, external_id', 'items': 'id, dataset_id, external_id', 'datasets': 'id'}


def upgrade() -> None:
    table = op.create_table('reference_epoch',
    sa.Column('id', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('n', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_reference_epoch'))
    )
    op.bulk_insert(table, [{'id': 1, 'n': secrets.randbits(62)}])
    if op.get_bind().dialect.name != 'postgresql':
        return  # SQLite: no id cache (one writer at a time; nothing reads the epoch)
    op.execute("CREATE FUNCTION bump_reference_epoch() RETURNS trigger LANGUAGE plpgsql AS "
               "$$ BEGIN UPDATE reference_epoch SET n = n + 1; RETURN NULL; END $$")
    for name, columns in _WATCHED.items():
        op.execute(f"CREATE TRIGGER {name}_reference_epoch AFTER DELETE OR TRUNCATE OR UPDATE OF {columns} "
                   f"ON {name} FOR EACH STATEMENT EXECUTE FUNCTION bump_reference_epoch()")


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        for name in _WATCHED:
            op.execute(f"DROP TRIGGER {name}_reference_epoch ON {name}")
        op.execute("DROP FUNCTION bump_reference_epoch()")
    op.drop_table('reference_epoch')
