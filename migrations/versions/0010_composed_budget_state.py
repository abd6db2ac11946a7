"""composed budget state: each account's RDP curve and PLD normal form, kept on append

A reservation used to recompose every charged event of its data set and person budget, so its
cost grew with the ledger (seconds after a hundred runs). ``budget_accounts.composed_state`` and
``person_budgets.composed_state`` now hold the composition of the charged events
(``app.core.privacy.composition.ComposedState``: the RDP curve on a fixed order grid, the PLD
normal form, the number of events, and the PLD epsilon at the budget's delta), updated in the
transaction of every ledger entry that changes it. This migration computes it for existing
ledgers by replaying their entries (``app.ledger.replay``: reservations and local guarantees
added, refunded reservations removed, each converted to the budget's relation).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""
import json
import math

from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

_TABLES = ('budget_accounts', 'person_budgets')
_ENTRY_COLUMNS = "e.id, e.seq, e.kind, e.run_id, e.event, e.parameters, e.epsilon"


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


def _entries(bind, where: str, key: int):
    """Transient ledger entries (never attached to a session) for ``app.ledger.replay``."""
    from app.db.models import LedgerEntry

    rows = bind.execute(sa.text(
        f"SELECT {_ENTRY_COLUMNS} FROM ledger_entries e JOIN budget_accounts a ON a.id = e.account_id "
        f"WHERE {where} = :key AND e.kind IN ('reservation', 'local', 'refund') ORDER BY e.id"), {"key": key}).all()
    return [LedgerEntry(seq=r.seq, kind=r.kind, run_id=r.run_id, event=_json(r.event),
                        parameters=_json(r.parameters) or {}, epsilon=r.epsilon) for r in rows]


def _store(bind, table: str, row_id: int, state, delta: float) -> None:
    pld = state.epsilon_pld(delta)
    value = {**state.to_json(), "epsilon_pld": pld if math.isfinite(pld) else None}
    statement = sa.text(f"UPDATE {table} SET composed_state = :state WHERE id = :id").bindparams(
        sa.bindparam("state", type_=sa.JSON()))
    bind.execute(statement, {"state": value, "id": row_id})


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('composed_state', sa.JSON(), nullable=True))
    from app.core.privacy.accounting import parse_relation
    from app.ledger import replay

    bind = op.get_bind()
    for row in bind.execute(sa.text("SELECT id, delta, relation FROM budget_accounts ORDER BY id")).all():
        state = replay(_entries(bind, "a.id", row.id), parse_relation(row.relation))
        _store(bind, 'budget_accounts', row.id, state, row.delta)
    for row in bind.execute(sa.text("SELECT id, delta, relation FROM person_budgets ORDER BY id")).all():
        state = replay(_entries(bind, "a.person_budget_id", row.id), parse_relation(row.relation))
        _store(bind, 'person_budgets', row.id, state, row.delta)


def downgrade() -> None:
    for table in reversed(_TABLES):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column('composed_state')
