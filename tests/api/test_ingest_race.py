"""Overlapping rating batches, single writes, rating deletes and user deletes racing over HTTP on
PostgreSQL: one lock order (rows, then the version shard rows) and the whole-transaction retry of
a deadlock's victim leave no 5xx and no orphan rating. The race runs PRIVREC_RACE_S seconds
(15 s by default in CI; 60 s for the full check)."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import pytest
from sqlalchemy import text

from tests.api.conftest import Env, add_items

R = "/v1/datasets/default"
N_ITEMS = 30
USERS = [f"racer{k}" for k in range(6)]
RACE_S = float(os.environ.get("PRIVREC_RACE_S", "15"))


def _batch(rng: random.Random, size: int) -> dict:
    pairs = {(rng.choice(USERS), f"i{rng.randrange(N_ITEMS)}") for _ in range(size)}
    return {"ratings": [{"user_id": u, "item_id": i, "rating": float(rng.randint(1, 5))} for u, i in pairs]}


@pytest.mark.integration
@pytest.mark.timeout(int(RACE_S) + 120)
def test_racing_batches_and_deletes_never_answer_5xx(env: Env) -> None:
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite serialises writers; the race needs concurrent transactions")
    add_items(env, N_ITEMS)
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def act(seed: int, step: int, rng: random.Random) -> int:
        kind = (seed + step) % 5
        if kind in (0, 1):  # the staged (COPY) path and the array path
            return env.client.post(f"{R}/ratings/batch", json=_batch(rng, (200, 12)[kind]),
                                   headers=env.ingest_service).status_code
        user, item = rng.choice(USERS), f"i{rng.randrange(N_ITEMS)}"
        if kind == 2:
            return env.client.put(f"{R}/users/{user}/ratings/{item}", json={"rating": 3.0},
                                  headers=env.ingest_service).status_code
        if kind == 3:
            return env.client.delete(f"{R}/users/{user}/ratings/{item}", headers=env.ingest_service).status_code
        return env.client.delete(f"/v1/users/{user}", headers=env.ingest_service).status_code

    def racer(seed: int) -> None:
        rng, step = random.Random(seed), 0
        try:
            while not stop.is_set():
                status = act(seed, step, rng)
                with lock:
                    statuses[status] += 1
                step += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    time.sleep(RACE_S)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(status < 500 for status in statuses), statuses
    assert statuses[200] > 0, statuses
    orphans = "SELECT count(*) FROM ratings r WHERE NOT EXISTS (SELECT 1 FROM users u WHERE u.id = r.user_id)"
    with env.session() as s:
        assert s.execute(text(orphans)).scalar_one() == 0


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_rating_delete_does_not_wait_for_the_references_lock(env: Env) -> None:
    """A rating delete creates no reference (it removes only its own row, then bumps the version
    shard), so it takes neither the references lock nor a user row lock: it goes through while a
    user delete elsewhere holds the references lock exclusively (LOCK ORDER in ratings_postgres)."""
    if env.settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite has no references lock: it serialises writers")
    from app.db.stores.ratings_postgres import REFERENCES_LOCK_KEY

    add_items(env, 2)
    svc = env.ingest_service
    assert env.client.put(f"{R}/users/keeper/ratings/i0", headers=svc, json={"rating": 4.0}).status_code == 201
    answers: list[int] = []
    with env.session() as holder:  # a user delete in progress elsewhere: the references lock held exclusively
        holder.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": REFERENCES_LOCK_KEY})
        deleter = threading.Thread(target=lambda: answers.append(
            env.client.delete(f"{R}/users/keeper/ratings/i0", headers=svc).status_code), daemon=True)
        deleter.start()
        deleter.join(60)  # generous: it must not be waiting on the lock this transaction holds
        waiting = holder.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                      "AND NOT granted")).scalar_one()
        holder.rollback()  # releases the lock, so a waiting delete cannot hang the test
    deleter.join(60)
    assert waiting == 0 and answers == [200]
