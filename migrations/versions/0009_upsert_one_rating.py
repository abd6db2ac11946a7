"""one-rating upsert as a server-side function: the references lock and the write in one round trip

A single rating (``PUT .../ratings/{item}``) took the shared references lock in one statement and
wrote in a second: the write's snapshot must be taken after the lock is granted, so that a user
deleted while the writer waited is seen as deleted (no orphan rating). A VOLATILE PL/pgSQL
function takes a fresh snapshot for every statement it runs (READ COMMITTED), so the lock and the
statements after it can go in one call: one round trip fewer per rating, three fewer for a new
user's first rating (issue 13, single upserts). PostgreSQL only (SQLite serialises writers).

``upsert_one_rating`` returns no row for an unknown data set; otherwise one row (rating_min,
rating_max, item_id, user_id, inserted), where ``inserted`` is NULL when nothing was written (an
unknown item or a value outside the range; no user is created then), true for a new rating and
false for an update. The lock key and the number of version shards are the caller's constants.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""
from alembic import op


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

_FUNCTION = """
CREATE FUNCTION upsert_one_rating(p_dataset text, p_user text, p_item text, p_value float8,
                                  p_now timestamptz, p_lock_key bigint, p_shards integer)
RETURNS TABLE (rating_min float8, rating_max float8, item_id bigint, user_id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_dataset integer;
  v_min float8;
  v_max float8;
  v_item bigint;
  v_user bigint;
  v_inserted boolean;
BEGIN
  PERFORM pg_advisory_xact_lock_shared(p_lock_key);
  -- every statement from here on reads a snapshot taken after the lock was granted
  SELECT d.id, d.rating_min, d.rating_max INTO v_dataset, v_min, v_max FROM datasets d WHERE d.name = p_dataset;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT i.id INTO v_item FROM items i WHERE i.dataset_id = v_dataset AND i.external_id = p_item;
  SELECT u.id INTO v_user FROM users u WHERE u.external_id = p_user;
  IF v_item IS NOT NULL AND p_value BETWEEN v_min AND v_max THEN
    IF v_user IS NULL THEN
      INSERT INTO users (external_id, created_at, updated_at) VALUES (p_user, p_now, p_now)
        ON CONFLICT (external_id) DO NOTHING RETURNING id INTO v_user;
      IF v_user IS NULL THEN  -- created by a concurrent writer that committed meanwhile
        SELECT u.id INTO v_user FROM users u WHERE u.external_id = p_user;
      END IF;
    END IF;
    INSERT INTO ratings AS r (dataset_id, user_id, item_id, value, created_at, updated_at)
      VALUES (v_dataset, v_user, v_item, p_value, p_now, p_now)
      ON CONFLICT (user_id, dataset_id, item_id)
      DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at
      RETURNING (r.xmax = 0) INTO v_inserted;
    INSERT INTO ratings_version_shards AS s (dataset_id, shard, n, changed_at)
      VALUES (v_dataset, pg_backend_pid() % p_shards, 1, p_now)
      ON CONFLICT (dataset_id, shard) DO UPDATE SET n = s.n + 1, changed_at = EXCLUDED.changed_at;
  END IF;
  RETURN QUERY SELECT v_min, v_max, v_item, v_user, v_inserted;
END $$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("DROP FUNCTION upsert_one_rating(text, text, text, float8, timestamptz, bigint, integer)")
