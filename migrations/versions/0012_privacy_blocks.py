"""user-level privacy blocks: users' cohorts, block accounts, the block calendar, runs' cohorts

Each user gets a cohort (the public calendar period of her creation, ``users.cohort``) kept past
her deletion in ``user_cohorts`` (keyed by a hash of her external id); every data set's account
and every person budget gets one block per cohort (``privacy_blocks``) with the owner's cap and
its own composed state; ``block_calendar`` fixes the period and the first period; a run records
the cohorts it reads (``training_runs.cohorts``); a data set may declare a public bound on the
users of one cohort (``datasets.max_users_per_period``); person budgets' cap changes become
hash-chained entries (``person_budget_entries``, from their history lists).

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
down_revision = '0011'
branch_labels = None
depends_on = None


def _json(value):
    import json

    return json.loads(value) if isinstance(value, str) else value


def _chain_person_histories(bind) -> None:
    """Each person budget's audited history (a JSON list) as its hash-chained entries."""
    from app.db.models import PersonBudgetEntry
    from app.ledger import GENESIS_HASH, compute_hash, person_entry_content

    insert = sa.text("INSERT INTO person_budget_entries (person_budget_id, seq, kind, actor, old_cap, new_cap, reason, "
                     "created_at, prev_hash, hash) VALUES (:pb, :seq, :kind, :actor, :old_cap, :new_cap, :reason, "
                     ":created_at, :prev_hash, :hash)")
    for pb_id, cap, history in bind.execute(sa.text("SELECT id, epsilon_cap, history FROM person_budgets ORDER BY id")).all():
        rows = _json(history) or [{"at": "", "actor": "system", "old_cap": None, "new_cap": cap, "reason": "created"}]
        prev = GENESIS_HASH
        for seq, row in enumerate(rows, start=1):
            # a row without its new cap (0004's creation row): the next row's old cap, else the current cap
            later = rows[seq].get("old_cap") if seq < len(rows) else None
            new_cap = row.get("new_cap") if row.get("new_cap") is not None else (later if later is not None else cap)
            entry = PersonBudgetEntry(person_budget_id=pb_id, seq=seq, kind="open" if seq == 1 else "cap_change",
                                      actor=str(row.get("actor") or "system"), old_cap=row.get("old_cap"),
                                      new_cap=float(new_cap), reason=row.get("reason"),
                                      created_at=str(row.get("at") or ""))
            digest = compute_hash(person_entry_content(entry), prev)
            bind.execute(insert, {"pb": pb_id, "seq": seq, "kind": entry.kind, "actor": entry.actor,
                                  "old_cap": entry.old_cap, "new_cap": entry.new_cap, "reason": entry.reason,
                                  "created_at": entry.created_at, "prev_hash": prev, "hash": digest})
            prev = digest


def upgrade() -> None:
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cohort', sa.String(length=16), nullable=True))
        batch_op.create_index(op.f('ix_users_cohort'), ['cohort'])
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
        sa.UniqueConstraint('owner', 'cohort', name=op.f('uq_privacy_blocks_owner_cohort')),
        sa.CheckConstraint('(account_id IS NULL) <> (person_budget_id IS NULL)', name=op.f('ck_privacy_blocks_one_owner')),
    )
    op.create_table(
        'person_budget_entries',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), primary_key=True),
        sa.Column('person_budget_id', sa.Integer(), sa.ForeignKey('person_budgets.id', ondelete='RESTRICT'),
                  nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('actor', sa.String(length=128), nullable=False),
        sa.Column('old_cap', sa.Float(), nullable=True),
        sa.Column('new_cap', sa.Float(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('created_at', sa.String(length=40), nullable=False),
        sa.Column('prev_hash', sa.String(length=64), nullable=False),
        sa.Column('hash', sa.String(length=64), nullable=False, unique=True),
        sa.UniqueConstraint('person_budget_id', 'seq', name=op.f('uq_person_budget_entries_budget_seq')),
        sa.CheckConstraint("kind IN ('open', 'cap_change')", name=op.f('ck_person_budget_entries_kind_kind')),
    )
    bind = op.get_bind()
    _chain_person_histories(bind)
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


def _history_from_chains(bind) -> None:
    """Each person budget's chain written back as its history list (what 0010 and before read)."""
    rows = bind.execute(sa.text("SELECT person_budget_id, actor, old_cap, new_cap, reason, created_at "
                                "FROM person_budget_entries ORDER BY person_budget_id, seq")).all()
    history: dict[int, list[dict]] = {}
    for r in rows:
        history.setdefault(r.person_budget_id, []).append(
            {"at": r.created_at, "actor": r.actor, "old_cap": r.old_cap, "new_cap": r.new_cap, "reason": r.reason})
    statement = sa.text("UPDATE person_budgets SET history = :history WHERE id = :id").bindparams(
        sa.bindparam("history", type_=sa.JSON()))
    for pb_id, rows_of in history.items():
        bind.execute(statement, {"history": rows_of, "id": pb_id})


def downgrade() -> None:
    _history_from_chains(op.get_bind())
    op.drop_table('person_budget_entries')
    op.drop_table('privacy_blocks')
    op.drop_table('block_calendar')
    op.drop_table('user_cohorts')
    with op.batch_alter_table('datasets', schema=None) as batch_op:
        batch_op.drop_column('max_users_per_period')
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.drop_column('cohorts')
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.drop_index(op.f('ix_users_cohort'))
        batch_op.drop_column('cohort')
