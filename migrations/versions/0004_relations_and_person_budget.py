"""one neighbouring relation per budget account

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-28

Adds ``budget_accounts.relation`` (default add/remove one user). Existing accounts are migrated to
the weakest relation among their charged entries (read through the legacy spellings: entries are
hash-chained and never rewritten), so every number an account shows holds under its relation:
an account holding randomised-response votes becomes ``replace_vote_values``, one with one-bit
runs without ``user_rows`` ``replace_one_user``. Such accounts recompute their spend with the
group-privacy conversion (app.ledger) when shown and on their next charge.
"""
import json

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0002'
branch_labels = None
depends_on = None

_ORDER = ('add_or_remove_one_user', 'replace_one_user', 'replace_vote_values')
_LEGACY = {
    'add_or_remove_one_user': 'add_or_remove_one_user',
    'add_remove_one_user': 'add_or_remove_one_user',
    'add_or_remove_one': 'add_or_remove_one_user',
    'replace_one_users_votes': 'replace_one_user',
    'replace_one_user': 'replace_one_user',
    'replace_vote_values': 'replace_vote_values',
}


def _relation(parameters) -> str:
    if isinstance(parameters, str):
        parameters = json.loads(parameters)
    text = str((parameters or {}).get('neighbouring_relation', 'add_or_remove_one_user'))
    # the long randomised-response text of local entries before the vocabulary was unified
    return _LEGACY.get(text, 'replace_vote_values' if 'votes' in text else 'add_or_remove_one_user')


def upgrade() -> None:
    with op.batch_alter_table('budget_accounts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('relation', sa.String(length=32), nullable=False,
                                      server_default='add_or_remove_one_user'))
        batch_op.create_check_constraint(
            'relation_kind', "relation IN ('add_or_remove_one_user', 'replace_one_user', 'replace_vote_values')")
    bind = op.get_bind()
    rows = bind.execute(sa.text(
        "SELECT account_id, parameters FROM ledger_entries WHERE kind IN ('reservation', 'local')")).all()
    weakest: dict[int, str] = {}
    for account_id, parameters in rows:
        rel = _relation(parameters)
        if _ORDER.index(rel) > _ORDER.index(weakest.get(account_id, _ORDER[0])):
            weakest[account_id] = rel
    for account_id, rel in weakest.items():
        bind.execute(sa.text("UPDATE budget_accounts SET relation = :rel WHERE id = :id"),
                     {"rel": rel, "id": account_id})


def downgrade() -> None:
    with op.batch_alter_table('budget_accounts', schema=None) as batch_op:
        batch_op.drop_constraint('relation_kind', type_='check')
        batch_op.drop_column('relation')
