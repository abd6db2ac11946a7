"""one neighbouring relation per budget account; per-person budgets

Revision ID: 0004
Revises: 0006
Create Date: 2026-11-28

Adds ``budget_accounts.relation`` (default add/remove one user). Existing accounts are migrated to
the weakest relation among their charged entries (read through the legacy spellings: entries are
hash-chained and never rewritten), so every number an account shows holds under its relation:
an account holding randomised-response votes becomes ``replace_vote_values``, one with one-bit
runs without ``user_rows`` ``replace_one_user``. Such accounts recompute their spend with the
group-privacy conversion (app.ledger) whenever it is read or charged.

Adds ``person_budgets`` (the per-person bound) and ``budget_accounts.person_budget_id``. One
budget, ``all``, holds every existing data set; its relation is the weakest of theirs, its delta
1e-6 and its cap the sum of their caps (at most what a person could lose before; the admin
lowers it), or 10 on an empty database.
"""
import json
from datetime import datetime, timezone

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0006'
branch_labels = None
depends_on = None

_ORDER = ('add_or_remove_one_user', 'replace_one_user', 'replace_vote_values')
_CHECK = "relation IN ('add_or_remove_one_user', 'replace_one_user', 'replace_vote_values')"
_LEGACY = {
    'add_or_remove_one_user': 'add_or_remove_one_user',
    'add_remove_one_user': 'add_or_remove_one_user',
    'add_or_remove_one': 'add_or_remove_one_user',
    'replace_one_users_votes': 'replace_one_user',
    'replace_one_user': 'replace_one_user',
    'replace_vote_values': 'replace_vote_values',
}
DEFAULT_PERSON_CAP = 10.0
DEFAULT_PERSON_DELTA = 1e-6


def _relation(parameters) -> str:
    if isinstance(parameters, str):
        parameters = json.loads(parameters)
    text = str((parameters or {}).get('neighbouring_relation', 'add_or_remove_one_user'))
    # the long randomised-response text of local entries before the vocabulary was unified
    return _LEGACY.get(text, 'replace_vote_values' if 'votes' in text else 'add_or_remove_one_user')


def _weakest(relations) -> str:
    return max(relations, key=_ORDER.index, default=_ORDER[0])


def _account_relations(bind) -> dict[int, str]:
    rows = bind.execute(sa.text(
        "SELECT account_id, parameters FROM ledger_entries WHERE kind IN ('reservation', 'local')")).all()
    weakest: dict[int, str] = {}
    for account_id, parameters in rows:
        weakest[account_id] = _weakest([weakest.get(account_id, _ORDER[0]), _relation(parameters)])
    return weakest


def upgrade() -> None:
    person_budgets = op.create_table('person_budgets',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('epsilon_cap', sa.Float(), nullable=False),
    sa.Column('delta', sa.Float(), nullable=False),
    sa.Column('relation', sa.String(length=32), nullable=False),
    sa.Column('history', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint(_CHECK, name=op.f('ck_person_budgets_relation_kind')),
    sa.CheckConstraint('epsilon_cap > 0', name=op.f('ck_person_budgets_cap_positive')),
    sa.CheckConstraint('delta > 0 AND delta < 1', name=op.f('ck_person_budgets_delta_range')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_person_budgets')),
    sa.UniqueConstraint('name', name=op.f('uq_person_budgets_name'))
    )
    with op.batch_alter_table('budget_accounts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('relation', sa.String(length=32), nullable=False,
                                      server_default='add_or_remove_one_user'))
        batch_op.add_column(sa.Column('person_budget_id', sa.Integer(), nullable=True))
        batch_op.create_check_constraint(op.f('ck_budget_accounts_relation_kind'), _CHECK)

    bind = op.get_bind()
    for account_id, rel in _account_relations(bind).items():
        bind.execute(sa.text("UPDATE budget_accounts SET relation = :rel WHERE id = :id"),
                     {"rel": rel, "id": account_id})
    accounts = bind.execute(sa.text("SELECT relation, epsilon_cap FROM budget_accounts")).all()
    now = datetime.now(timezone.utc)
    op.bulk_insert(person_budgets, [{
        "name": "all", "epsilon_cap": float(sum(cap for _, cap in accounts)) or DEFAULT_PERSON_CAP,
        "delta": DEFAULT_PERSON_DELTA, "relation": _weakest(rel for rel, _ in accounts), "created_at": now,
        "updated_at": now, "history": [{"at": now.isoformat(), "actor": "migration 0004", "old_cap": None,
                                        "new_cap": None, "reason": "per-person budget created over every data set"}],
    }])
    bind.execute(sa.text("UPDATE budget_accounts SET person_budget_id = "
                         "(SELECT id FROM person_budgets WHERE name = 'all')"))

    with op.batch_alter_table('budget_accounts', schema=None) as batch_op:
        batch_op.alter_column('person_budget_id', existing_type=sa.Integer(), nullable=False)
        batch_op.create_foreign_key(op.f('fk_budget_accounts_person_budget_id_person_budgets'), 'person_budgets',
                                    ['person_budget_id'], ['id'], ondelete='RESTRICT')
        batch_op.create_index('ix_budget_accounts_person_budget', ['person_budget_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('budget_accounts', schema=None) as batch_op:
        batch_op.drop_index('ix_budget_accounts_person_budget')
        batch_op.drop_constraint(op.f('fk_budget_accounts_person_budget_id_person_budgets'), type_='foreignkey')
        batch_op.drop_constraint(op.f('ck_budget_accounts_relation_kind'), type_='check')
        batch_op.drop_column('person_budget_id')
        batch_op.drop_column('relation')
    op.drop_table('person_budgets')
