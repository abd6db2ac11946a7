"""Votes -> one-bit training -> published model -> privileged scores, on SQLite and PostgreSQL.

Votes randomised at ingestion: the ledger holds the local guarantee once and an InP run on the
stored bits is post-processing (a zero-cost reservation and commit). Raw votes: GraP charges its
user-level event. Serving fits the user from her own stored votes; a non-voter gets the fallback.
"""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting import dp_event

from app import ledger, model_store
from app.core import onebit
from app.core.privacy.accounting import epsilon_rdp, event_from_json
from app.db import loaders
from app.db.models import LedgerEntry, ModelVersion, TrainingRun
from app.db.session import session_scope
from app.errors import InvalidRequest
from app.schemas.serving import RecommendationQuery
from app.schemas.votes import VoteIn, VoteRow
from app.services import budget, votes
from app.services.serving import popular, published, recommend, similar
from app.services.training import requests as train_requests
from app.services.training import runner, schedule
from tests.integration.platform_helpers import create_dataset, schedule_clock

N_USERS, N_ITEMS, PER_USER = 120, 24, 12
HYPER = {"rank": 2, "n_steps": 30}


def _seed(url: str, *, eps0: float | None, cap: int | None = PER_USER) -> None:
    """Two taste groups (even users like even items); every user votes on PER_USER items."""
    from app.db.models import Item
    from app.services.budget import get_dataset

    with session_scope(url) as s:
        ds = get_dataset(s, "default")
        s.add_all([Item(dataset_id=ds.id, external_id=f"i{k}", title=f"Item {k}", categories=["demo"], features={})
                   for k in range(N_ITEMS)])
        s.flush()
        votes.set_vote_settings(s, dataset="default", local_epsilon=eps0, votes_per_user_cap=cap, actor="admin")
    rng = np.random.default_rng(0)
    rows = [VoteRow(user_id=f"u{u}", item_id=f"i{i}", vote=1 if (u % 2) == (i % 2) else -1)
            for u in range(N_USERS) for i in rng.choice(N_ITEMS, size=PER_USER, replace=False)]
    with session_scope(url) as s:
        votes.upsert_votes_batch(s, dataset="default", rows=rows)
    model_store.clear_cache()


def _start(url: str, **kw) -> int:
    args = dict(dataset="default", algorithm="onebit", hyperparameters=dict(HYPER), actor="admin")
    args.update(kw)
    with session_scope(url) as s:
        return train_requests.start_training(s, **args).id


def _entries(url: str) -> list[tuple[str, int | None, float | None, dict]]:
    with session_scope(url) as s:
        return [(e.kind, e.run_id, e.epsilon, e.event) for e in s.query(LedgerEntry).order_by(LedgerEntry.seq)]


def test_randomised_votes_train_for_free_and_serve_voters(db_url, settings):
    url = db_url
    create_dataset(url, cap=30.0, relation="replace_vote_values")
    _seed(url, eps0=2.0)  # user level 12 x 2 = 24 <= 30
    with pytest.raises(InvalidRequest, match="cannot be chosen"):
        _start(url, hyperparameters={**HYPER, "pre_randomised": False})
    run_id = _start(url)  # no epsilon: post-processing of the bits stored at ingestion
    with session_scope(url) as s:
        run = s.get(TrainingRun, run_id)
        assert run.config["pre_randomised"] is True and run.config["local_epsilon"] == 2.0
        assert run.config["votes_per_user"] == PER_USER and run.epsilon_charged == 0.0
        spent_before = ledger.spent(s, ledger.account_for(s, run.dataset_id)).epsilon_rdp
    assert runner.run_training(run_id, url=url, settings=settings) == "succeeded"
    kinds = _entries(url)
    assert [k for k, *_ in kinds] == ["open", "local", "reservation", "commit"]
    local, reservation = kinds[1], kinds[2]
    assert isinstance(event_from_json(reservation[3]), dp_event.NoOpDpEvent) and reservation[2] == 0.0
    assert local[2] == pytest.approx(epsilon_rdp(onebit.local_randomisation_event(2.0, PER_USER), 1e-6))
    with session_scope(url) as s:
        acct = ledger.account_for(s, budget.get_dataset(s, "default").id)
        assert ledger.spent(s, acct).epsilon_rdp == pytest.approx(spent_before) == pytest.approx(local[2])
        assert ledger.verify_chain(s, acct.id, recompute_spend=True).ok
        commit = s.query(LedgerEntry).filter(LedgerEntry.kind == "commit").one()
        assert commit.parameters["released"] == ["item_factors", "item_like_probability", "metrics"]
        row, model = model_store.get_active_model(s, "default")
        assert row.algorithm == "onebit" and row.epsilon == 0.0 and isinstance(model, onebit.OneBitModel)
        _check_voter_scores(s, model)
        out = recommend.recommend_for_user(s, dataset="default", user_id="stranger", query=RecommendationQuery(n=5))
        assert out.fallback and out.fallback_reason == "dp_popular: user has no votes" and len(out.items) == 5
        top = popular.popular(s, dataset="default", n=3)
        assert len(top.items) == 3
        # one-bit releases no counts: /popular serves its mean P(thumbs up), labelled as such
        assert top.popularity_kind == "mean_p_thumbs_up"
        assert all(x.dp_count is None and 0.0 < x.popularity < 1.0 for x in top.items)
        assert [x.popularity for x in top.items] == sorted(model.item_like_probability, reverse=True)[:3]
        assert all(x.dp_count is None for x in out.items)  # the fallback above: no count either
        assert len(similar.similar(s, dataset="default", item_id="i0", n=3).items) == 3
        page = published.embeddings_page(s, dataset="default", offset=0, limit=5)
        assert page.rank == model.rank and len(page.items[0].vector) == model.rank


def _check_voter_scores(s, model) -> None:
    """Scores are P(thumbs up) from the user's own stored bits, voted items excluded; the even
    group's top items are mostly even (a loose check: the bits are noisy)."""
    agree = []
    for user in ("u0", "u1", "u2", "u3"):
        out = recommend.recommend_for_user(s, dataset="default", user_id=user, query=RecommendationQuery(n=6))
        assert not out.fallback and out.algorithm == "onebit" and len(out.items) == 6
        assert all(0.0 <= it.score <= 1.0 for it in out.items)
        items, values = votes.user_votes_arrays(s, dataset_id=model_store.get_active_version(s, "default").dataset_id,
                                                user_id=user)
        assert not set(items) & {it.item_id for it in out.items}
        positions = {str(i): k for k, i in enumerate(model.item_ids.tolist())}
        idx, scores = onebit.recommend_onebit(model, np.array([positions[i] for i in items]), np.asarray(values), 6)
        assert [it.score for it in out.items] == pytest.approx(scores.tolist())
        agree += [int(it.item_id[1:]) % 2 == int(user[1:]) % 2 for it in out.items]
    assert np.mean(agree) >= 0.6


def test_raw_votes_grap_is_charged_its_user_level_event(db_url, settings):
    url = db_url
    create_dataset(url, cap=10.0, relation="replace_vote_values")
    _seed(url, eps0=None)
    with pytest.raises(InvalidRequest, match="raw votes"):
        _start(url, epsilon=2.0, hyperparameters={**HYPER, "pre_randomised": True, "local_epsilon": 1.0})
    with pytest.raises(InvalidRequest, match="exactly one"):
        _start(url)  # a charged run needs its epsilon
    run_id = _start(url, epsilon=3.0, hyperparameters={**HYPER, "mechanism": "grap", "n_steps": 5})
    with session_scope(url) as s:
        res = ledger.reservation_for(s, run_id)
        config = onebit.OneBitConfig.from_dict({**s.get(TrainingRun, run_id).config, "seed": 0})
        assert res.parameters["level"] == "user" and res.parameters["votes_per_user"] == PER_USER
        assert 0 < res.epsilon <= 3.0 + 1e-9
        assert res.epsilon == pytest.approx(epsilon_rdp(onebit.onebit_event(config), 1e-6))
    assert runner.run_training(run_id, url=url, settings=settings) == "succeeded"
    with session_scope(url) as s:
        out = recommend.recommend_for_user(s, dataset="default", user_id="u5", query=RecommendationQuery(n=4))
        assert not out.fallback and all(0.0 <= it.score <= 1.0 for it in out.items)


def test_other_mechanisms_on_randomised_bits_are_charged(db_url):
    create_dataset(db_url, cap=30.0, relation="replace_vote_values")
    _seed(db_url, eps0=2.0)
    run_id = _start(db_url, epsilon=2.0, hyperparameters={**HYPER, "mechanism": "grap", "n_steps": 5})
    with session_scope(db_url) as s:
        run = s.get(TrainingRun, run_id)
        assert run.config["pre_randomised"] is False and run.epsilon_charged > 0


def test_a_free_run_refuses_votes_stored_after_randomisation_was_turned_off(db_url, settings):
    """Queue a free (pre-randomised) run, turn randomisation off while no vote exists yet, then
    ingest raw votes: the run must fail (and be refunded), never train raw votes for free."""
    from app.db.models import Item
    from app.services.budget import get_dataset

    create_dataset(db_url, cap=30.0, relation="replace_vote_values")
    with session_scope(db_url) as s:
        ds = get_dataset(s, "default")
        s.add_all([Item(dataset_id=ds.id, external_id=f"i{k}", categories=[], features={}) for k in range(N_ITEMS)])
        s.flush()
        votes.set_vote_settings(s, dataset="default", local_epsilon=2.0, votes_per_user_cap=PER_USER, actor="admin")
    run_id = _start(db_url)
    with session_scope(db_url) as s:
        assert s.get(TrainingRun, run_id).config["pre_randomised"] is True
        votes.set_vote_settings(s, dataset="default", local_epsilon=None, votes_per_user_cap=PER_USER, actor="admin")
    with session_scope(db_url) as s:
        votes.upsert_votes_batch(s, dataset="default", rows=[
            VoteRow(user_id=f"u{u}", item_id=f"i{i}", vote=1) for u in range(20) for i in range(3)])
    assert runner.run_training(run_id, url=db_url, settings=settings) == "failed"
    with session_scope(db_url) as s:
        run = s.get(TrainingRun, run_id)
        assert "no longer randomises" in run.error and run.refunded
        assert s.query(ModelVersion).count() == 0  # nothing was published


def test_too_large_vote_matrix_is_refused_from_public_facts_or_charged(db_url, settings, monkeypatch):
    """user_rows x items over the limit is refused before anything is reserved (public facts);
    without user_rows the voter count decides, so a refusal after the read is charged and
    names no count."""
    create_dataset(db_url, cap=30.0, relation="replace_vote_values")
    _seed(db_url, eps0=None)
    monkeypatch.setattr("app.core.onebit.privacy.MAX_ENTRIES", 10 * N_ITEMS)
    with pytest.raises(InvalidRequest, match="dense limit"):
        _start(db_url, epsilon=1.0, hyperparameters={**HYPER, "user_rows": 11})
    monkeypatch.setattr("app.core.onebit.train.MAX_ENTRIES", N_USERS * N_ITEMS - 1)
    run_id = _start(db_url, epsilon=1.0)
    assert runner.run_training(run_id, url=db_url, settings=settings) == "failed"
    with session_scope(db_url) as s:
        run = s.get(TrainingRun, run_id)
        assert "charged" in run.error and str(N_USERS) not in run.error and not run.refunded
        assert ledger.spent(s, ledger.account_for(s, run.dataset_id)).epsilon_rdp > 0.0


def test_a_free_run_never_reads_a_bit_not_randomised_with_its_epsilon0(db_url, settings):
    """A stored bit that was not randomised with ε0 (written around this module) neither makes a
    free run fail nor is read: the loader takes only bits randomised with ε0."""
    from app.db.models import Item, User, Vote
    from app.services.budget import get_dataset

    create_dataset(db_url, cap=30.0, relation="replace_vote_values")
    _seed(db_url, eps0=2.0)
    with session_scope(db_url) as s:
        ds = get_dataset(s, "default")
        user = User(external_id="raw-writer")
        s.add(user)
        s.flush()
        item = s.query(Item).filter_by(dataset_id=ds.id, external_id="i0").one()
        s.add(Vote(dataset_id=ds.id, user_id=user.id, item_id=item.id, value=1, randomised=False))
    run_id = _start(db_url)
    assert runner.run_training(run_id, url=db_url, settings=settings) == "succeeded"
    with session_scope(db_url) as s:
        ds = get_dataset(s, "default")
        read, _ = loaders.load_votes(s, ds, local_epsilon=2.0)
        everything, _ = loaders.load_votes(s, ds)
        assert everything.nnz == read.nnz + 1 and read.nnz == N_USERS * PER_USER


def test_user_rows_pads_for_add_remove_and_drops_excess_voters(db_url, settings):
    """GraP with user_rows above the voter count trains and publishes user_rows and the add/remove
    relation; user_rows below it drops voters at random and is charged like any run."""
    create_dataset(db_url, cap=30.0, relation="replace_vote_values")
    _seed(db_url, eps0=None)
    grap = {**HYPER, "mechanism": "grap", "n_steps": 3}
    ok = _start(db_url, epsilon=2.0, hyperparameters={**grap, "user_rows": N_USERS + 30})
    with session_scope(db_url) as s:
        params = ledger.reservation_for(s, ok).parameters
        assert params["user_rows"] == N_USERS + 30 and params["neighbouring_relation"] == "add_or_remove_one_user"
    assert runner.run_training(ok, url=db_url, settings=settings) == "succeeded"
    with session_scope(db_url) as s:
        _, model = model_store.get_active_model(s, "default")
        assert model.config["user_rows"] == N_USERS + 30 and model.metadata["user_rows"] == N_USERS + 30
        assert model.metadata["voter_count_public"] is False
        spent = ledger.spent(s, ledger.account_for(s, budget.get_dataset(s, "default").id)).epsilon_rdp
    small = _start(db_url, epsilon=2.0, hyperparameters={**grap, "user_rows": N_USERS - 20})
    assert runner.run_training(small, url=db_url, settings=settings) == "succeeded"
    with session_scope(db_url) as s:
        run = s.get(TrainingRun, small)
        assert run.error is None and not run.refunded and run.private_data_read
        acct = ledger.account_for(s, run.dataset_id)
        assert ledger.spent(s, acct).epsilon_rdp > spent
        assert ledger.verify_chain(s, acct.id, recompute_spend=True).ok


def test_scheduled_retraining_follows_the_declared_kind(db_url, settings):
    """The algorithm follows the data set's declared kind (public), not whether votes exist."""
    from app.services.budget import get_dataset

    create_dataset(db_url, cap=30.0, relation="replace_vote_values")
    with session_scope(db_url) as s:
        get_dataset(s, "default").kind = "votes"
    clock = schedule_clock(settings)  # one retrain interval between ticks: each is due
    sched = lambda: schedule.scheduled_retrain(url=db_url, settings=settings, enqueue=False, now=clock())["default"]  # noqa: E731
    _seed(db_url, eps0=2.0)
    outcome = sched()
    assert outcome.startswith("started:")
    with session_scope(db_url) as s:
        run = s.get(TrainingRun, int(outcome.split(":")[1]))
        assert run.algorithm == "onebit" and run.epsilon_charged == 0.0 and run.trigger == "schedule"
    assert runner.run_training(run.id, url=db_url, settings=settings) == "succeeded"
    # unchanged data: retrained all the same (no "skipped:unchanged" bit); retrains the active
    # one-bit model's algorithm and hyper-parameters, still free
    outcome = sched()
    assert outcome.startswith("started:")
    with session_scope(db_url) as s:
        again = s.get(TrainingRun, int(outcome.split(":")[1]))
        assert again.algorithm == "onebit" and again.epsilon_charged == 0.0
        assert again.config["pre_randomised"] is True and again.config["local_epsilon"] == 2.0


@pytest.mark.timeout(120)
def test_concurrent_votes_never_rerandomise_or_pass_the_cap(db_url):
    """Eight writers at once: one (user, item) gets exactly one bit; a user never passes the cap."""
    import threading

    from sqlalchemy import select

    from app.db.models import Dataset, User, Vote, VoteAllowance
    from app.errors import Conflict

    create_dataset(db_url, cap=30.0, relation="replace_vote_values")
    _seed(db_url, eps0=2.0)  # cap PER_USER = 12
    outcomes: list[str] = []
    lock = threading.Lock()

    def race(calls: list[tuple[str, str]]) -> list[str]:
        barrier = threading.Barrier(len(calls))
        outcomes.clear()

        def vote(user: str, item: str) -> None:
            barrier.wait()
            try:
                with session_scope(db_url) as s:
                    status = votes.upsert_vote(s, dataset="default", user_id=user, item_id=item,
                                               body=VoteIn(vote=1)).status
            except Conflict as exc:
                status = exc.code
            with lock:
                outcomes.append(status)

        threads = [threading.Thread(target=vote, args=c) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sorted(outcomes)

    assert race([("same", "i0")] * 8) == ["created"] + ["unchanged"] * 7
    with session_scope(db_url) as s:  # fill "racer" to 10 of 12, then race 8 new items for 2 slots
        votes.upsert_votes_batch(s, dataset="default", rows=[
            VoteRow(user_id="racer", item_id=f"i{k}", vote=1) for k in range(10, 20)])
    assert race([("racer", f"i{k}") for k in range(8)]) == ["created"] * 2 + ["vote_cap_exceeded"] * 6
    with session_scope(db_url) as s:
        for user, n in (("same", 1), ("racer", PER_USER)):
            uid = s.scalar(select(User.id).where(User.external_id == user))
            assert s.query(Vote).filter(Vote.user_id == uid).count() == n
            key = votes.allowance_key(s.scalar(select(Dataset.id).where(Dataset.name == "default")), user)
            assert s.scalar(select(VoteAllowance.randomised_votes).where(VoteAllowance.user_key == key)) == n
