"""One relation per account, group-privacy conversion in the ledger, the per-person bound and
migration 0004, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from alembic import command
from sqlalchemy import MetaData, create_engine, insert, pool, select

from app import ledger
from app.core.onebit import local_randomisation_event
from app.core.privacy.accounting import compose, epsilon_rdp, event_to_json, gaussian
from app.db.migrate import alembic_config, upgrade_head
from app.db.models import BudgetAccount, LedgerEntry, PersonBudget, TrainingRun
from app.db.session import dispose_engines, normalise_url, session_scope
from app.errors import BudgetExceeded, CapChangeRefused, InvalidRequest, PersonBudgetExceeded, RelationRefused
from app.services import budget
from tests.integration.platform_helpers import create_dataset

DELTA = 1e-6
Z = 3.0
RR = {"neighbouring_relation": "replace_vote_values"}


def _reserve(url: str, name: str, z: float = Z, parameters: dict | None = None) -> int:
    with session_scope(url) as s:
        ds = budget.get_dataset(s, name)
        run = TrainingRun(dataset_id=ds.id, algorithm="dpals", requested_epsilon=1.0, delta=DELTA)
        s.add(run)
        s.flush()
        ledger.reserve(s, dataset=ds, event=gaussian(z), parameters=parameters or {}, actor="tester", run_id=run.id)
        return run.id


def _local(url: str, name: str, eps0: float = 0.5, k: int = 2) -> None:
    with session_scope(url) as s:
        ledger.record_local_guarantee(s, dataset=budget.get_dataset(s, name), event=local_randomisation_event(eps0, k),
                                      parameters=RR, actor="tester")


def _n_entries(url: str) -> int:
    with session_scope(url) as s:
        return len(list(s.scalars(select(LedgerEntry.id))))


# ----------------------------------------------------------------------------- item 3
def test_an_account_refuses_a_guarantee_that_does_not_imply_its_relation(db_url):
    """Randomised response hides vote values, not membership: an add/remove account refuses it
    (the old ledger composed it into the add/remove spend), and nothing is written."""
    create_dataset(db_url, "ratings")
    before = _n_entries(db_url)
    with pytest.raises(RelationRefused) as err:
        _local(db_url, "ratings")
    assert err.value.status_code == 409 and err.value.code == "relation_not_implied"
    assert err.value.details["account_relation"] == "add_or_remove_one_user"
    assert err.value.details["event_relation"] == "replace_vote_values"
    with pytest.raises(RelationRefused):  # a one-bit run without user_rows: replace one user
        _reserve(db_url, "ratings", parameters={"neighbouring_relation": "replace_one_user"})
    with pytest.raises(InvalidRequest, match="unknown neighbouring relation"):
        _reserve(db_url, "ratings", parameters={"neighbouring_relation": "someone"})
    assert _n_entries(db_url) == before
    with session_scope(db_url) as s:
        view = budget.get_budget(s, dataset="ratings")
        assert view.neighbouring_relation == "add_or_remove_one_user" and view.spent_epsilon_rdp == 0.0


def test_a_weaker_account_charges_add_remove_events_by_group_privacy(db_url):
    """An add/remove Gaussian of multiplier z costs a z/2 Gaussian on a replace account; the
    released event stays as released, the converted one is recorded and composed."""
    create_dataset(db_url, "votes", relation="replace_vote_values")
    _local(db_url, "votes")
    run = _reserve(db_url, "votes")
    with session_scope(db_url) as s:
        entry = ledger.reservation_for(s, run)
        assert entry.event == event_to_json(gaussian(Z))
        assert entry.parameters["charged_event"] == event_to_json(gaussian(Z / 2))
        assert entry.parameters["neighbouring_relation"] == "add_or_remove_one_user"
        assert entry.parameters["charged_relation"] == "replace_vote_values"
        assert "group privacy" in entry.parameters["conversion"]
        assert entry.epsilon == pytest.approx(epsilon_rdp(gaussian(Z / 2), DELTA))
        expected = epsilon_rdp(compose([local_randomisation_event(0.5, 2), gaussian(Z / 2)]), DELTA)
        acct = ledger.account_for(s, budget.get_dataset(s, "votes").id)
        assert ledger.spent(s, acct).epsilon_rdp == pytest.approx(expected, rel=1e-12)
        assert ledger.verify_chain(s, acct.id, recompute_spend=True).ok
        view = budget.get_budget(s, dataset="votes")
        assert view.neighbouring_relation == "replace_vote_values"
        assert view.neighbouring_relations == ["add_or_remove_one_user", "replace_vote_values"]
        assert view.spent_epsilon_rdp == ledger.round_up(expected)


# ----------------------------------------------------------------------------- item 4
def test_a_person_in_two_data_sets_has_one_allowance(db_url):
    """Two data sets of the default person budget `all`: each fits its own cap, the composition
    of both is refused by the per-person cap, with its numbers; a refund gives the room back."""
    one = epsilon_rdp(gaussian(Z), DELTA)
    two = epsilon_rdp(compose([gaussian(Z)] * 2), DELTA)
    person_cap = (one + two) / 2  # room for one reservation of the pair, not two
    create_dataset(db_url, "a", cap=10.0)
    create_dataset(db_url, "b", cap=10.0)
    with session_scope(db_url) as s:
        ledger.change_person_cap(s, name="all", new_cap=person_cap, reason=None, actor="tester")
    first = _reserve(db_url, "a")
    with pytest.raises(PersonBudgetExceeded) as err:
        _reserve(db_url, "b")
    d = err.value.details
    assert err.value.status_code == 409 and err.value.code == "person_budget_exceeded"
    assert isinstance(err.value, BudgetExceeded)  # the scheduler's skip covers it
    assert d["person_budget"] == "all" and d["dataset"] == "b" and d["epsilon_cap"] == person_cap
    assert d["prior_spent_epsilon"] == ledger.round_up(one) and d["would_spend_epsilon"] >= two - 1e-6
    with session_scope(db_url) as s:
        view = budget.get_budget(s, dataset="b")
        assert view.spent_epsilon_rdp == 0.0 and view.dataset_remaining_epsilon == 10.0  # its own cap is untouched
        person = view.person_budget
        # what is left composes every cap: the person budget's binds
        assert view.binding_cap == "person_budget" and view.remaining_epsilon == person.remaining_epsilon
        assert person.name == "all" and person.datasets == ["a", "b"]
        assert person.spent_epsilon_rdp == ledger.round_up(one)
        assert person.remaining_epsilon == ledger.remaining(person_cap, one)
        ledger.refund(s, dataset=budget.get_dataset(s, "a"), run_id=first, actor="tester", reason="test")
    _reserve(db_url, "b")  # the refund released the person's allowance too
    with session_scope(db_url) as s:
        assert budget.get_person_budget(s, name="all").spent_epsilon_rdp == ledger.round_up(one)


def test_person_budget_relation_and_cap_rules(db_url):
    with session_scope(db_url) as s:
        budget.put_person_budget(s, name="weak", epsilon_cap=5.0, delta=DELTA, relation="replace_one_user",
                                 reason=None, actor="tester")
    with pytest.raises(RelationRefused, match="does not imply"):  # `all` is add/remove
        create_dataset(db_url, "votes", relation="replace_vote_values", person_budget="all")
    create_dataset(db_url, "ratings", person_budget="weak", person_cap=5.0)  # add/remove implies replace
    run = _reserve(db_url, "ratings")
    with session_scope(db_url) as s:
        weak = budget.get_person_budget(s, name="weak")
        # the person budget composes the add/remove event converted to its own relation
        assert weak.spent_epsilon_rdp == ledger.round_up(epsilon_rdp(gaussian(Z / 2), DELTA))
        assert budget.get_budget(s, dataset="ratings").spent_epsilon_rdp == ledger.round_up(epsilon_rdp(gaussian(Z), DELTA))
        assert ledger.reservation_for(s, run).parameters["person_budget"] == "weak"
        with pytest.raises(InvalidRequest, match="requires a reason"):
            budget.put_person_budget(s, name="weak", epsilon_cap=6.0, delta=None, relation=None, reason=None, actor="t")
        with pytest.raises(CapChangeRefused):
            budget.put_person_budget(s, name="weak", epsilon_cap=0.01, delta=None, relation=None, reason=None, actor="t")
        with pytest.raises(Exception, match="cannot change"):
            budget.put_person_budget(s, name="weak", epsilon_cap=5.0, delta=1e-5, relation=None, reason=None, actor="t")
        out = budget.put_person_budget(s, name="weak", epsilon_cap=6.0, delta=None, relation=None, reason="more",
                                       actor="admin:root")
        assert out.epsilon_cap == 6.0 and out.history[-1]["reason"] == "more" and out.history[-1]["old_cap"] == 5.0


@pytest.mark.timeout(180)
def test_concurrent_reservations_on_two_data_sets_never_overspend_the_person(db_url):
    """Threads reserve on two data sets (each with a roomy cap) of one person budget at once:
    exactly k fit under the per-person cap, whichever data set they hit."""
    k, n = 3, 10
    fit = epsilon_rdp(compose([gaussian(Z)] * k), DELTA)
    over = epsilon_rdp(compose([gaussian(Z)] * (k + 1)), DELTA)
    person_cap = (fit + over) / 2
    create_dataset(db_url, "a", cap=50.0)
    create_dataset(db_url, "b", cap=50.0)
    with session_scope(db_url) as s:
        ledger.change_person_cap(s, name="all", new_cap=person_cap, reason=None, actor="tester")
    barrier = threading.Barrier(n)
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt(name: str) -> None:
        barrier.wait()
        try:
            _reserve(db_url, name)
            result = "accepted"
        except PersonBudgetExceeded:
            result = "refused"
        except BaseException as exc:  # noqa: BLE001
            result = f"error: {exc!r}"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=attempt, args=("ab"[i % 2],)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["accepted"] * k + ["refused"] * (n - k), outcomes
    with session_scope(db_url) as s:
        pb = ledger.person_budget_named(s, "all")
        assert ledger.person_spent(s, pb).epsilon_rdp <= person_cap
        assert ledger.person_spent(s, pb).n_events == k
        for name in "ab":
            assert ledger.verify_chain(s, ledger.account_for(s, budget.get_dataset(s, name).id).id,
                                       recompute_spend=True).ok


# ----------------------------------------------------------------------------- migration 0004
def _legacy_ledger(url: str) -> None:
    """At revision 0002: a data set whose ledger holds a randomised-response local entry and an
    add/remove reservation, written with the legacy spellings, and an add/remove-only data set."""
    engine = create_engine(normalise_url(url), poolclass=pool.NullPool)
    meta = MetaData()
    meta.reflect(engine)
    t = meta.tables
    events = {"local": local_randomisation_event(0.5, 2), "reservation": gaussian(Z)}
    relations = {"local": "replace the values of one user's votes (at most votes_per_user_cap of them): which "
                          "items a user voted on is NOT hidden by randomised response",
                 "reservation": "add_remove_one_user"}
    with engine.begin() as conn:
        for ds_id, name, kinds in [(1, "votes", ("local", "reservation")), (2, "ratings", ("reservation",))]:
            conn.execute(insert(t["datasets"]).values(id=ds_id, name=name, rating_min=1.0, rating_max=5.0,
                                                        ratings_version=0, created_at=ledger.utcnow()))
            conn.execute(insert(t["budget_accounts"]).values(id=ds_id, dataset_id=ds_id, epsilon_cap=8.0,
                                                               delta=DELTA, accountant="rdp", created_at=ledger.utcnow(),
                                                               updated_at=ledger.utcnow()))
            prev, charged = ledger.GENESIS_HASH, []
            rows = [("open", None, {}, None)] + [(k, event_to_json(events[k]), {"neighbouring_relation": relations[k]},
                                                   epsilon_rdp(events[k], DELTA)) for k in kinds]
            for seq, (kind, event, parameters, eps) in enumerate(rows, start=1):
                run_id = None
                if kind == "reservation":
                    run_id = conn.execute(insert(t["training_runs"]).values(
                        dataset_id=ds_id, algorithm="dpals", config={}, requested_epsilon=1.0, delta=DELTA,
                        status="succeeded", progress=1.0, trigger="manual", actor="t", ratings_version=0, attempts=1,
                        output_persisted=True, refunded=False, created_at=ledger.utcnow())).inserted_primary_key[0]
                if event is not None:
                    charged.append(events[kind])
                spent = epsilon_rdp(compose(charged), DELTA) if charged else 0.0
                content = {"account_id": ds_id, "seq": seq, "kind": kind, "run_id": run_id, "actor": "t",
                           "event": event, "parameters": parameters, "epsilon": eps, "spent_rdp": spent,
                           "spent_pld": spent, "epsilon_cap": 8.0, "delta": DELTA, "reason": None,
                           "created_at": f"2026-01-01T00:00:0{seq}.000000+00:00"}
                digest = ledger.compute_hash(content, prev)
                conn.execute(insert(t["ledger_entries"]).values(**content, prev_hash=prev, hash=digest))
                prev = digest
    engine.dispose()


def test_migration_0004_declares_the_weakest_relation_and_one_person_budget(db_url):
    command.downgrade(alembic_config(db_url), "0002")
    _legacy_ledger(db_url)
    dispose_engines()
    upgrade_head(db_url)
    with session_scope(db_url) as s:
        accounts = {a.dataset.name: a for a in s.scalars(select(BudgetAccount))}
        assert accounts["votes"].relation == "replace_vote_values"
        assert accounts["ratings"].relation == "add_or_remove_one_user"
        pb = s.scalar(select(PersonBudget))
        assert (pb.name, pb.relation, pb.epsilon_cap, pb.delta) == ("all", "replace_vote_values", 16.0, 1e-6)
        assert {a.person_budget_id for a in accounts.values()} == {pb.id}
        # hash chains still verify against what was charged when each entry was written
        for acct in accounts.values():
            assert ledger.verify_chain(s, acct.id, recompute_spend=True).ok
        # the votes account now shows its spend with the add/remove reservation converted
        converted = epsilon_rdp(compose([local_randomisation_event(0.5, 2), gaussian(Z / 2)]), DELTA)
        view = budget.get_budget(s, dataset="votes")
        assert view.neighbouring_relation == "replace_vote_values"
        assert view.spent_epsilon_rdp == ledger.round_up(converted)
        assert budget.get_budget(s, dataset="ratings").spent_epsilon_rdp == ledger.round_up(epsilon_rdp(gaussian(Z), DELTA))
        person = epsilon_rdp(compose([local_randomisation_event(0.5, 2), gaussian(Z / 2), gaussian(Z / 2)]), DELTA)
        assert view.person_budget.spent_epsilon_rdp == ledger.round_up(person)
    _reserve(db_url, "votes")  # the next charge composes the converted history
    with session_scope(db_url) as s:
        acct = ledger.account_for(s, budget.get_dataset(s, "votes").id)
        last = s.scalar(select(LedgerEntry).where(LedgerEntry.account_id == acct.id).order_by(LedgerEntry.seq.desc()))
        expected = epsilon_rdp(compose([local_randomisation_event(0.5, 2), gaussian(Z / 2), gaussian(Z / 2)]), DELTA)
        assert last.spent_rdp == pytest.approx(expected, rel=1e-12)
    command.downgrade(alembic_config(db_url), "0002")  # and back
    upgrade_head(db_url)
