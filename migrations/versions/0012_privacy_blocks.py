"""user-level privacy blocks: users' cohorts, block accounts, the block calendar, runs' cohorts

Each user gets a cohort (the public calendar period of her creation, ``users.cohort``) kept past
her deletion in ``user_cohorts`` (keyed by a hash of her external id); every data set's account
and every person budget gets one block per cohort (``privacy_blocks``) with the owner's cap and
its own composed state; ``block_calendar`` fixes the period and the first period; a run records
the cohorts it reads (``training_runs.cohorts``); a data set may declare a public bound on the
users of one cohort (``datasets.max_users_per_period``).

Existing users become one ``legacy`` cohort that has already spent what the ledger charged: each
account's and person budget's ``legacy`` block starts with its composed state (reservations
written before carry no cohorts and count as ``legacy``'s; local guarantees count for every block).

Revision ID: 0012
Revises: 0010
Create Date: 2026-11-27
"""
from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cohort', sa.String(length=16), nullable=True))
        batch_op.create_index('ix_users_cohort', ['cohort'])
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cohorts', sa.JSON(), nullable=True))
    with op.batch_alter_table('datasets', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_users_per_period', sa.Integer(), nullable=True))
    op.create_table(
        'user_cohorts',
        sa.Column('user_key', sa.String(length=64), primary_key=True),
        sa.Column('cohort', sa.String(length=16), nullable=False),
    )
    op.create_table(
        'block_calendar',
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column('period', sa.String(length=8), nullable=False),
        sa.Column('start', sa.String(length=16), nullable=False),
    )
    op.create_table(
        'privacy_blocks',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('account_id', sa.Integer(), sa.ForeignKey('budget_accounts.id', ondelete='RESTRICT'), nullable=True),
        sa.Column('person_budget_id', sa.Integer(), sa.ForeignKey('person_budgets.id', ondelete='RESTRICT'),
                  nullable=True),
        sa.Column('owner', sa.String(length=24), nullable=False),
        sa.Column('cohort', sa.String(length=16), nullable=False),
        sa.Column('composed_state', sa.JSON(), nullable=True),
        sa.Column('n_runs', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint('owner', 'cohort', name='uq_privacy_blocks_owner_cohort'),
        sa.CheckConstraint('(account_id IS NULL) <> (person_budget_id IS NULL)', name='ck_privacy_blocks_one_owner'),
    )
    bind = op.get_bind()
    bind.execute(sa.text("UPDATE users SET cohort = 'legacy'"))
    runs = ("(SELECT count(*) FROM ledger_entries e WHERE e.account_id = {a} AND e.kind = 'reservation' "
            "AND NOT EXISTS (SELECT 1 FROM ledger_entries r WHERE r.run_id = e.run_id AND r.kind = 'refund'))")
    bind.execute(sa.text(
        "INSERT INTO privacy_blocks (account_id, person_budget_id, owner, cohort, composed_state, n_runs) "
        "SELECT a.id, NULL, 'account:' || a.id, 'legacy', a.composed_state, " + runs.format(a="a.id")
        + " FROM budget_accounts a"))
    bind.execute(sa.text(
        "INSERT INTO privacy_blocks (account_id, person_budget_id, owner, cohort, composed_state, n_runs) "
        "SELECT NULL, p.id, 'person_budget:' || p.id, 'legacy', p.composed_state, "
        "(SELECT count(*) FROM ledger_entries e JOIN budget_accounts a ON a.id = e.account_id "
        "WHERE a.person_budget_id = p.id AND e.kind = 'reservation' AND NOT EXISTS "
        "(SELECT 1 FROM ledger_entries r WHERE r.run_id = e.run_id AND r.kind = 'refund')) FROM person_budgets p"))


def downgrade() -> None:
    op.drop_table('privacy_blocks')
    op.drop_table('block_calendar')
    op.drop_table('user_cohorts')
    with op.batch_alter_table('datasets', schema=None) as batch_op:
        batch_op.drop_column('max_users_per_period')
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.drop_column('cohorts')
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.drop_index('ix_users_cohort')
        batch_op.drop_column('cohort')
