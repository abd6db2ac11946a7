"""Privacy ledger on SQLite and PostgreSQL: concurrency, idempotency, refunds, hash chain."""

from __future__ import annotations

import threading

import pytest
from alembic import command
from sqlalchemy import select, text

from app import cli, ledger
from app.config import reset_settings_cache
from app.core.privacy.accounting import compose, epsilon_pld, epsilon_rdp, gaussian
from app.core.privacy.composition import ComposedState
from app.db.migrate import alembic_config, upgrade_head
from app.db.models import LedgerEntry, TrainingRun
from app.db.session import dispose_engines, session_scope
from app.errors import BudgetExceeded, CapChangeRefused, Conflict, InvalidRequest
from app.services import budget
from tests.integration.platform_helpers import create_dataset

DELTA = 1e-6
Z = 3.0  # noise multiplier of the test event


def _new_run(s, ds) -> TrainingRun:
    run = TrainingRun(dataset_id=ds.id, algorithm="dpals", requested_epsilon=1.0, delta=DELTA)
    s.add(run)
    s.flush()
    return run


def _reserve(url: str, name: str = "default", z: float = Z) -> int:
    with session_scope(url) as s:
        ds = budget.get_dataset(s, name)
        run = _new_run(s, ds)
        ledger.reserve(s, dataset=ds, event=gaussian(z), parameters={"test": True}, actor="tester", run_id=run.id)
        return run.id


def _cap_fitting(k: int) -> float:
    """A cap that k reservations of gaussian(Z) fit under, but not k + 1."""
    fit = epsilon_rdp(compose([gaussian(Z)] * k), DELTA)
    over = epsilon_rdp(compose([gaussian(Z)] * (k + 1)), DELTA)
    assert fit < over
    return (fit + over) / 2


@pytest.mark.timeout(180)
def test_concurrent_reservations_accept_exactly_k(db_url):
    k, n = 3, 10
    cap = _cap_fitting(k)
    create_dataset(db_url, cap=cap, delta=DELTA)
    barrier = threading.Barrier(n)
    accepted: list[int] = []
    refused: list[BudgetExceeded] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def attempt() -> None:
        barrier.wait()
        try:
            run_id = _reserve(db_url)
            with lock:
                accepted.append(run_id)
        except BudgetExceeded as exc:
            with lock:
                refused.append(exc)
        except BaseException as exc:  # noqa: BLE001
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(accepted) == k
    assert len(refused) == n - k
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        acct = ledger.account_for(s, ds.id)
        exact = ledger.spent(s, acct, recompute=True)
        assert exact.epsilon_rdp <= cap
        assert exact.n_events == k
        assert ledger.verify_chain(s, acct.id, recompute_spend=True).ok
        seqs = list(s.scalars(select(LedgerEntry.seq).where(LedgerEntry.account_id == acct.id).order_by(LedgerEntry.seq)))
        assert seqs == list(range(1, k + 2))  # "open" + k reservations, no gaps
    for exc in refused:  # prior spend, request and cap reported separately
        d = exc.details
        assert d["epsilon_cap"] == cap
        assert d["requested_epsilon"] == pytest.approx(epsilon_rdp(gaussian(Z), DELTA), abs=1e-6)
        assert d["prior_spent_epsilon"] >= epsilon_rdp(compose([gaussian(Z)] * k), DELTA) - 1e-6
        assert d["would_spend_epsilon"] > cap
        assert exc.status_code == 409


def test_reservation_is_idempotent_per_run(db_url):
    create_dataset(db_url, cap=50.0, delta=DELTA)
    run_id = _reserve(db_url)
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        again = ledger.reserve(s, dataset=ds, event=gaussian(Z), parameters={}, actor="redelivery", run_id=run_id)
        assert again.seq == 2
        with pytest.raises(Conflict):
            ledger.reserve(s, dataset=ds, event=gaussian(Z + 1), parameters={}, actor="x", run_id=run_id)
    with session_scope(db_url) as s:
        n = s.scalar(select(text("count(*)")).select_from(LedgerEntry).where(LedgerEntry.kind == "reservation"))
        assert n == 1
        view = budget.get_budget(s, dataset="default")
        assert view.spent_epsilon_rdp == ledger.round_up(epsilon_rdp(gaussian(Z), DELTA))


def test_refund_rules(db_url):
    create_dataset(db_url, cap=50.0, delta=DELTA)
    a, b = _reserve(db_url), _reserve(db_url)
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        ledger.commit(s, dataset=ds, run_id=a, actor="worker")
        with pytest.raises(Conflict):
            ledger.refund(s, dataset=ds, run_id=a, actor="worker", reason="too late")
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        before = budget.get_budget(s, dataset="default").spent_epsilon_rdp
        r1 = ledger.refund(s, dataset=ds, run_id=b, actor="worker", reason="failed early")
        r2 = ledger.refund(s, dataset=ds, run_id=b, actor="worker", reason="again")
        assert r1.id == r2.id
        with pytest.raises(Conflict):
            ledger.commit(s, dataset=ds, run_id=b, actor="worker")
        with pytest.raises(Conflict):
            ledger.reserve(s, dataset=ds, event=gaussian(Z), parameters={}, actor="x", run_id=b)
    with session_scope(db_url) as s:
        after = budget.get_budget(s, dataset="default")
        assert after.spent_epsilon_rdp < before
        assert after.spent_epsilon_rdp == ledger.round_up(epsilon_rdp(gaussian(Z), DELTA))
        assert after.n_charged_runs == 1
        acct = ledger.account_for(s, budget.get_dataset(s, "default").id)
        assert ledger.verify_chain(s, acct.id, recompute_spend=True).ok


def test_hash_chain_detects_tampering(db_url):
    create_dataset(db_url, cap=50.0, delta=DELTA)
    for _ in range(3):
        _reserve(db_url)
    with session_scope(db_url) as s:
        acct_id = ledger.account_for(s, budget.get_dataset(s, "default").id).id
        assert ledger.verify_chain(s, acct_id).ok
        assert budget.verify_ledger(s, dataset="default", recompute_spend=True) == {
            "dataset": "default", "ok": True, "n_entries": 4, "bad_seq": None, "reason": None}
    # lower a recorded spend: the content hash no longer matches
    with session_scope(db_url) as s:
        s.execute(text("UPDATE ledger_entries SET epsilon = 0.001 WHERE seq = 3"))
    with session_scope(db_url) as s:
        check = ledger.verify_chain(s, acct_id)
        assert not check.ok and check.bad_seq == 3
        assert budget.verify_ledger(s, dataset="default")["bad_seq"] == 3
    # rewrite an entry *and* its hash: the next entry's prev_hash breaks
    with session_scope(db_url) as s:
        entry = s.scalar(select(LedgerEntry).where(LedgerEntry.seq == 2))
        entry.parameters = {"test": "forged"}
        entry.hash = ledger.compute_hash(ledger.entry_content(entry), entry.prev_hash)
    with session_scope(db_url) as s:
        check = ledger.verify_chain(s, acct_id)
        assert not check.ok and check.bad_seq == 3
    # deleting an entry leaves a gap
    with session_scope(db_url) as s:
        s.execute(text("DELETE FROM ledger_entries WHERE seq = 4"))
        check = ledger.verify_chain(s, acct_id)
        assert not check.ok


def test_cap_changes_are_audited(db_url):
    create_dataset(db_url, cap=5.0, delta=DELTA)
    _reserve(db_url, z=2.0)
    with session_scope(db_url) as s:
        spent = budget.get_budget(s, dataset="default").spent_epsilon_rdp
        with pytest.raises(InvalidRequest):
            budget.change_cap(s, dataset="default", new_cap=8.0, reason="  ", actor="admin")
        with pytest.raises(CapChangeRefused) as info:
            budget.change_cap(s, dataset="default", new_cap=spent / 2, reason="shrink", actor="admin")
        assert info.value.details["spent_epsilon"] == spent
        with pytest.raises(InvalidRequest):
            budget.change_cap(s, dataset="default", new_cap=float("nan"), reason="x", actor="admin")
    with session_scope(db_url) as s:
        view = budget.change_cap(s, dataset="default", new_cap=8.0, reason="quarterly review", actor="admin")
        assert view.epsilon_cap == 8.0
        # lowering: no reason needed
        view = budget.change_cap(s, dataset="default", new_cap=spent + 0.5, reason=None, actor="admin")
    with session_scope(db_url) as s:
        rows, total = budget.list_ledger(s, dataset="default")
        kinds = [r.kind for r in rows]
        assert kinds == ["open", "reservation", "cap_change", "cap_change"]
        raised = rows[2]
        assert raised.reason == "quarterly review" and raised.actor == "admin"
        assert raised.parameters == {"old_cap": 5.0, "new_cap": 8.0}
        view = budget.get_budget(s, dataset="default")
        assert view.epsilon_cap == spent + 0.5
        assert view.remaining_epsilon <= view.epsilon_cap - view.spent_epsilon_rdp + 1e-12
        entry = budget.ledger_entry_out(rows[1]).model_dump()
        assert entry["event"]["class_name"] == "GaussianDpEvent"
        assert entry["parameters"]["neighbouring_relation"] == "add_or_remove_one_user"


def test_conservative_rounding():
    assert ledger.round_up(1.0000000001) == 1.000001
    assert ledger.round_up(2.0) == 2.0
    assert ledger.round_down(1.9999999) == 1.999999
    assert ledger.remaining(1.0, 0.3) == 0.7  # exact decimal of the floats, floored
    assert ledger.remaining(1.0, 0.30000000000000004) == 0.699999
    assert ledger.remaining(1.0, 1.5) == 0.0


_RESERVE_SCRIPT = """
import sys, time
from app import ledger
from app.core.privacy.accounting import gaussian
from app.db.models import TrainingRun
from app.db.session import session_scope
from app.errors import BudgetExceeded
from app.services import budget
url, z, start_at = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
name = sys.argv[4] if len(sys.argv) > 4 else "default"
time.sleep(max(0.0, start_at - time.time()))
try:
    with session_scope(url) as s:
        ds = budget.get_dataset(s, name)
        run = TrainingRun(dataset_id=ds.id, algorithm="dpals", requested_epsilon=1.0, delta=1e-6)
        s.add(run)
        s.flush()
        ledger.reserve(s, dataset=ds, event=gaussian(z), parameters={}, actor="proc", run_id=run.id)
    print("accepted")
except BudgetExceeded:
    print("refused")
"""


@pytest.mark.timeout(180)
def test_concurrent_reservations_from_separate_processes(db_url):
    import subprocess
    import sys
    import time
    from pathlib import Path

    k, n = 2, 6
    cap = _cap_fitting(k)
    create_dataset(db_url, cap=cap, delta=DELTA)
    repo = Path(__file__).resolve().parents[2]
    start_at = time.time() + 4.0  # all processes hit the ledger at about the same moment
    procs = [
        subprocess.Popen([sys.executable, "-c", _RESERVE_SCRIPT, db_url, str(Z), str(start_at)],
                         cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    results = [o.strip() for o, _ in outs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    assert sorted(results) == ["accepted"] * k + ["refused"] * (n - k)
    with session_scope(db_url) as s:
        acct = ledger.account_for(s, budget.get_dataset(s, "default").id)
        assert ledger.spent(s, acct, recompute=True).epsilon_rdp <= cap
        assert ledger.verify_chain(s, acct.id, recompute_spend=True).ok


@pytest.mark.timeout(180)
def test_concurrent_processes_on_two_data_sets_never_overspend_the_person(db_url):
    """Separate processes reserve on two data sets of the per-person budget `all` at once: the
    per-person cap (checked in the same locked reservation) admits exactly k of them."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    k, n = 2, 6
    cap = _cap_fitting(k)
    create_dataset(db_url, "a", cap=50.0, delta=DELTA)
    create_dataset(db_url, "b", cap=50.0, delta=DELTA)
    with session_scope(db_url) as s:
        ledger.change_person_cap(s, name="all", new_cap=cap, reason=None, actor="tester")
    repo = Path(__file__).resolve().parents[2]
    start_at = time.time() + 4.0
    procs = [
        subprocess.Popen([sys.executable, "-c", _RESERVE_SCRIPT, db_url, str(Z), str(start_at), "ab"[i % 2]],
                         cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(n)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    assert sorted(o.strip() for o, _ in outs) == ["accepted"] * k + ["refused"] * (n - k)
    with session_scope(db_url) as s:
        pb = ledger.person_budget_named(s, "all")
        assert ledger.person_spent(s, pb).epsilon_rdp <= cap and ledger.person_spent(s, pb).n_events == k


# ----------------------------------------------------------------------------- stored composed state
def _states_match_replay(s, name: str = "default") -> None:
    """The account's and its person budget's stored states equal a replay of the ledger, and
    every check of ``ledger verify`` passes."""
    acct = ledger.account_for(s, budget.get_dataset(s, name).id)
    stored = ComposedState.from_json(acct.composed_state)
    replayed = ledger.replay(s.scalars(select(LedgerEntry).where(LedgerEntry.account_id == acct.id)
                                       .order_by(LedgerEntry.seq)), ledger.account_relation(acct))
    assert stored is not None and stored.differences(replayed) == []
    assert ledger.verify_chain(s, acct.id, recompute_spend=True).ok
    assert ledger.verify_person_budget(s, acct.person_budget).ok


def test_stored_state_equals_a_full_replay_after_many_appends(db_url):
    """Forty reservations of mixed events (and refunds between them): the stored state is what a
    replay composes, and its epsilon is what the library's accountant gives for the whole history."""
    create_dataset(db_url, cap=1000.0, delta=DELTA)
    multipliers = [Z + (k % 7) for k in range(40)]
    runs = [_reserve(db_url, z=z) for z in multipliers]
    with session_scope(db_url) as s:
        ds = budget.get_dataset(s, "default")
        for run_id in runs[5:40:9]:
            ledger.refund(s, dataset=ds, run_id=run_id, actor="tester", reason="failed before any read")
    kept = [z for k, z in enumerate(multipliers) if k not in range(5, 40, 9)]
    with session_scope(db_url) as s:
        _states_match_replay(s)
        acct = ledger.account_for(s, budget.get_dataset(s, "default").id)
        exact = epsilon_rdp(compose([gaussian(z) for z in kept]), DELTA)
        stored = ledger.spent(s, acct)
        assert stored.n_events == len(kept)
        assert exact <= stored.epsilon_rdp <= exact * (1 + 1e-12)  # never below the composition
        assert stored.epsilon_pld == pytest.approx(epsilon_pld(compose([gaussian(z) for z in kept]), DELTA), rel=1e-3)
        person = ledger.person_spent(s, acct.person_budget)
        assert exact <= person.epsilon_rdp <= exact * (1 + 1e-12)


def test_stored_state_equals_a_replay_after_concurrent_reservations(db_url):
    """Threads reserving on two data sets of one person budget at once: both accounts' states and
    the person budget's equal their replays."""
    create_dataset(db_url, "a", cap=100.0, delta=DELTA)
    create_dataset(db_url, "b", cap=100.0, delta=DELTA)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def attempt(name: str, z: float) -> None:
        barrier.wait()
        try:
            for _ in range(3):
                _reserve(db_url, name, z=z)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=attempt, args=("ab"[i % 2], Z + i)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with session_scope(db_url) as s:
        for name in ("a", "b"):
            _states_match_replay(s, name)
        assert ledger.person_spent(s, ledger.person_budget_named(s, "all")).n_events == 24


def test_ledger_verify_catches_a_tampered_state_or_entry(db_url, monkeypatch, capsys):
    create_dataset(db_url, cap=50.0, delta=DELTA)
    for _ in range(3):
        _reserve(db_url)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("SECRET_KEY", "a-test-secret-of-at-least-32-characters!")
    reset_settings_cache()
    assert cli.main(["ledger", "verify"]) == 0
    with session_scope(db_url) as s:
        acct = ledger.account_for(s, budget.get_dataset(s, "default").id)
        state = dict(acct.composed_state)
        acct.composed_state = {**state, "rdp": [x / 2 for x in state["rdp"]]}  # a state that would overspend
    with session_scope(db_url) as s:
        check = ledger.verify_chain(s, acct.id, recompute_spend=True)
        assert not check.ok and "rdp curve" in check.reason
    assert cli.main(["ledger", "verify"]) == 1
    assert '"ok": false' in capsys.readouterr().out
    with session_scope(db_url) as s:
        s.get(type(acct), acct.id).composed_state = state  # restored
        pb = ledger.person_budget_named(s, "all")
        pb.composed_state = {**pb.composed_state, "n_events": 2}
    with session_scope(db_url) as s:
        assert ledger.verify_chain(s, acct.id, recompute_spend=True).ok
        check = ledger.verify_person_budget(s, ledger.person_budget_named(s, "all"))
        assert not check.ok and "n events" in check.reason
    assert cli.main(["ledger", "verify", "--dataset", "default"]) == 1
    with session_scope(db_url) as s:
        pb = ledger.person_budget_named(s, "all")
        pb.composed_state = {**pb.composed_state, "n_events": 3}
        s.execute(text("UPDATE ledger_entries SET epsilon = 0.001 WHERE seq = 2 AND account_id = :a"), {"a": acct.id})
    with session_scope(db_url) as s:
        check = ledger.verify_chain(s, acct.id, recompute_spend=True)
        assert not check.ok and check.bad_seq == 2
    assert cli.main(["ledger", "verify"]) == 1
    reset_settings_cache()


def test_migration_0010_computes_the_state_of_an_existing_ledger(db_url):
    """Down to 0009 (no stored state) with a ledger of reservations, a refund and a cap change on two
    data sets; the upgrade computes every state, equal to a replay, and charges go on from it."""
    create_dataset(db_url, "a", cap=60.0, delta=DELTA)
    create_dataset(db_url, "b", cap=60.0, delta=DELTA)
    runs = [_reserve(db_url, name, z=Z + k) for k, name in enumerate("aabab")]
    with session_scope(db_url) as s:
        ledger.refund(s, dataset=budget.get_dataset(s, "a"), run_id=runs[1], actor="tester", reason="test")
        budget.change_cap(s, dataset="b", new_cap=70.0, reason="more runs", actor="tester")
        before = {name: budget.get_budget(s, dataset=name) for name in "ab"}
    dispose_engines()
    command.downgrade(alembic_config(db_url), "0009")
    upgrade_head(db_url)
    with session_scope(db_url) as s:
        for name in "ab":
            _states_match_replay(s, name)
            assert budget.get_budget(s, dataset=name) == before[name]
        assert ledger.person_spent(s, ledger.person_budget_named(s, "all")).n_events == 4
    _reserve(db_url, "a")
    with session_scope(db_url) as s:
        _states_match_replay(s, "a")


def test_ledger_benchmark_quick_form_runs():
    """The ledger benchmark's quick form (tiny histories) runs and writes its rows."""
    from benchmarks import ledger as ledger_bench

    rows = ledger_bench.run_sizes((2, 5), backends=("sqlite",))
    metrics = {(r["dataset"], r["metric"]) for r in rows}
    assert {("sqlite-2-runs", "reservation_seconds"), ("sqlite-5-runs", "projection_seconds")} <= metrics
    assert all(r["value"] >= 0 for r in rows)
