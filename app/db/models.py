"""ORM tables (SQLAlchemy 2). "Model" here means a database table; trained recommendation
models are ``ModelVersion`` rows pointing at immutable artifacts (``app.core.mf.model.PublicModel``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, get_args, overload

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, column_property, mapped_column, relationship

__all__ = [
    "Base",
    "table_of",
    "utcnow",
    "as_aware",
    "Dataset",
    "User",
    "Item",
    "Rating",
    "TrainingRun",
    "ModelVersion",
    "BudgetAccount",
    "LedgerEntry",
    "SimilaritySource",
    "ItemSimilarity",
    "PublicRatingConsent",
    "PublicRatingConsentEvent",
    "Vote",
    "VoteAllowance",
    "VOTE_RANDOMISERS",
    "RUN_STATUSES",
    "RunStatus",
    "DATASET_KINDS",
    "LEDGER_KINDS",
    "bump_ratings_version",
    "bump_ratings_version_sharded",
    "RatingsVersionShard",
    "ReferenceEpoch",
    "RevokedToken",
]

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

RunStatus = Literal["queued", "running", "succeeded", "failed"]
RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)  # the training_runs.status check constraint
DATASET_KINDS = ("ratings", "votes")  # the public, declared kind of a data set's private data
LEDGER_KINDS = ("open", "reservation", "commit", "refund", "cap_change", "local")
VOTE_RANDOMISERS = ("server", "client")  # who applied randomised response to a stored vote

# BigInteger primary keys that still autoincrement on SQLite (INTEGER PRIMARY KEY).
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    """Timezone-aware UTC now."""
    return datetime.now(UTC)


@overload
def as_aware(value: datetime) -> datetime: ...
@overload
def as_aware(value: None) -> None: ...
def as_aware(value: datetime | None) -> datetime | None:
    """A stored timestamp as timezone-aware UTC (SQLite returns naive ones)."""
    return value if value is None or value.tzinfo is not None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


def table_of(model: type[Base]) -> Table:
    """The ``Table`` of a mapped class: SQLAlchemy types ``__table__`` as any ``FromClause`` (a
    class may be mapped to a join or a select), while every class here is declared on one table."""
    table = model.__table__
    if not isinstance(table, Table):
        raise TypeError(f"{model.__name__} is not mapped to a single table")
    return table


class Dataset(Base):
    """A rating data set: the scope of one privacy budget and of one active model."""

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str | None] = mapped_column(Text, default=None)
    rating_min: Mapped[float] = mapped_column(Float, default=0.5)
    rating_max: Mapped[float] = mapped_column(Float, default=5.0)
    # Declared by the admin (public): what the data set collects, "ratings" or "votes". Scheduled
    # retraining picks its algorithm from this and the active model, never from the data.
    kind: Mapped[str] = mapped_column(String(16), default="ratings", server_default="ratings")
    # Admin-declared public bound on the number of users (None: not declared). Every rule that
    # needs a user count reads it: the delta warning (delta > 1/(10 max_users)), one-bit's
    # ``user_rows`` default and the public facts handed to training.
    max_users: Mapped[int | None] = mapped_column(Integer, default=None)
    # admin-declared public bound on the users one cohort (privacy block) of this data set can hold;
    # a run's user bound is it times the non-legacy blocks it may read, plus max_users for legacy
    max_users_per_period: Mapped[int | None] = mapped_column(Integer, default=None)
    # Bumped in the same transaction as any rating insert/update/delete (bump_ratings_version).
    # Private: nothing public (scheduling included) may depend on it.
    # ``ratings_version`` (mapped below) = this column + the data set's RatingsVersionShard counts.
    ratings_version_base: Mapped[int] = mapped_column("ratings_version", BigInteger, default=0, server_default="0")
    if TYPE_CHECKING:  # mapped below, once RatingsVersionShard exists (declared here for type checkers only)
        ratings_version: Mapped[int]
    ratings_changed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    # Votes (thumbs up/down): when ``vote_local_epsilon`` is set, every vote is randomised once on
    # arrival (randomised response with epsilon0) and only the randomised bit is stored;
    # ``votes_per_user_cap`` bounds each user's votes (the user-level guarantee is cap x epsilon0).
    vote_local_epsilon: Mapped[float | None] = mapped_column(Float, default=None)
    votes_per_user_cap: Mapped[int | None] = mapped_column(Integer, default=None)
    # An admin's activation pins the active version: publications stop activating until unpinned.
    model_pinned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        CheckConstraint("rating_min < rating_max", name="rating_range"),
        CheckConstraint("vote_local_epsilon IS NULL OR vote_local_epsilon > 0", name="vote_local_epsilon_positive"),
        CheckConstraint("votes_per_user_cap IS NULL OR votes_per_user_cap > 0", name="votes_per_user_cap_positive"),
        CheckConstraint("kind IN ('ratings', 'votes')", name="kind_kind"),
        CheckConstraint("max_users IS NULL OR max_users > 0", name="max_users_positive"),
    )


class User(Base):
    """A rater, known by an external string id (the bearer token's subject)."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    external_id: Mapped[str] = mapped_column(String(128), unique=True)
    # the privacy block she belongs to: the public calendar period of her first creation
    # (app.core.privacy.blocks), set once (app.db.stores.blocks.settle_cohorts) and never changed;
    # NULL until settled (a run never reads a user whose cohort is unsettled)
    cohort: Mapped[str | None] = mapped_column(String(16), default=None, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class UserCohort(Base):
    """A user's cohort kept past her deletion, keyed by a hash of her external id (as vote
    allowances are), so that a user deleted and created again returns to her original block."""

    __tablename__ = "user_cohorts"

    user_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    cohort: Mapped[str] = mapped_column(String(16))


class BlockCalendar(Base):
    """The one row fixing the deployment's block calendar: the period of a cohort (``month`` or
    ``day``) and the first period of the deployment. Fixed once written (cohorts depend on it)."""

    __tablename__ = "block_calendar"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    period: Mapped[str] = mapped_column(String(8))
    start: Mapped[str] = mapped_column(String(16))


class PrivacyBlock(Base):
    """One privacy block: the charges of one cohort on one data set's account (``account_id``) or
    on one person budget (``person_budget_id``); exactly one of the two is set. Its cap, delta and
    relation are its owner's. ``composed_state`` is kept on append like an account's."""

    __tablename__ = "privacy_blocks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int | None] = mapped_column(ForeignKey("budget_accounts.id", ondelete="RESTRICT"), default=None)
    person_budget_id: Mapped[int | None] = mapped_column(ForeignKey("person_budgets.id", ondelete="RESTRICT"),
                                                         default=None)
    owner: Mapped[str] = mapped_column(String(24))  # "account:<id>" or "person_budget:<id>" (unique with cohort)
    cohort: Mapped[str] = mapped_column(String(16))
    composed_state: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    n_runs: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        UniqueConstraint("owner", "cohort", name="uq_privacy_blocks_owner_cohort"),
        CheckConstraint("(account_id IS NULL) <> (person_budget_id IS NULL)", name="one_owner"),
    )


class Item(Base):
    """A catalogue item of one data set with public features."""

    __tablename__ = "items"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    external_id: Mapped[str] = mapped_column(String(128))
    title: Mapped[str | None] = mapped_column(String(512), default=None)
    categories: Mapped[list[Any]] = mapped_column(JSON, default=list)
    features: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    active: Mapped[bool] = mapped_column(Boolean, default=True, server_default=text("true"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    __table_args__ = (UniqueConstraint("dataset_id", "external_id", name="uq_items_dataset_external"),)


class Rating(Base):
    """One user's rating of one item (unique per data set, user and item; upserted).

    No foreign keys (their per-row triggers were most of a bulk upsert's time): the ratings store
    resolves references set-based in the writing transaction while holding the *references lock*
    shared (a transaction-scoped advisory lock, :mod:`app.db.stores.ratings_postgres`), and
    ``delete_user`` holds it exclusively while it deletes the user's ratings, so no rating can
    outlive its user. Code that deletes users, items or data sets must take that lock exclusively
    and delete their ratings itself (no cascade).
    Keyed by (user, data set, item) alone, no surrogate id (nothing read it; it cost a sequence
    value and a second B-tree insert per row). Upserts name the conflict target by its columns.
    """

    __tablename__ = "ratings"

    dataset_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    user_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    item_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    value: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    __table_args__ = (
        # user first: it also serves a user's ratings and their deletion, so the table needs no
        # other index (each index is a B-tree insert per upserted row)
        PrimaryKeyConstraint("user_id", "dataset_id", "item_id", name="pk_ratings"),
    )


RELATIONS_CHECK = "relation IN ('add_or_remove_one_user', 'replace_one_user', 'replace_vote_values')"


class PersonBudget(Base):
    """A per-person bound: one (epsilon cap, delta) composing the charged events of every data set
    whose budget account names it (data sets that can hold the same person; ``all`` by default)."""

    __tablename__ = "person_budgets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    epsilon_cap: Mapped[float] = mapped_column(Float)
    delta: Mapped[float] = mapped_column(Float)
    # the one relation its numbers hold under; every member data set's relation implies it
    relation: Mapped[str] = mapped_column(String(32), default="add_or_remove_one_user")
    # no longer written: cap changes are hash-chained PersonBudgetEntry rows (migration 0012 moved
    # the rows written before into them)
    history: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # the composition of every member's charged events (app.core.privacy.composition.ComposedState),
    # updated in the transaction of each charge; ``privrec ledger verify`` replays it
    composed_state: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    __table_args__ = (
        CheckConstraint(RELATIONS_CHECK, name="relation_kind"),
        CheckConstraint("epsilon_cap > 0", name="cap_positive"),
        CheckConstraint("delta > 0 AND delta < 1", name="delta_range"),
    )


class PersonBudgetEntry(Base):
    """One hash-chained entry of a person budget's own ledger: its opening and every cap change
    (``hash = sha256(canonical JSON(content) || prev_hash)``, as :class:`LedgerEntry`)."""

    __tablename__ = "person_budget_entries"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    person_budget_id: Mapped[int] = mapped_column(ForeignKey("person_budgets.id", ondelete="RESTRICT"))
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # open | cap_change
    actor: Mapped[str] = mapped_column(String(128))
    old_cap: Mapped[float | None] = mapped_column(Float, default=None)
    new_cap: Mapped[float] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[str] = mapped_column(String(40))  # ISO-8601 UTC, part of the hash
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)

    __table_args__ = (
        UniqueConstraint("person_budget_id", "seq", name="uq_person_budget_entries_budget_seq"),
        CheckConstraint("kind IN ('open', 'cap_change')", name="kind_kind"),
    )


class BudgetAccount(Base):
    """The (epsilon cap, delta) privacy budget of one data set."""

    __tablename__ = "budget_accounts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="RESTRICT"), unique=True)
    epsilon_cap: Mapped[float] = mapped_column(Float)
    delta: Mapped[float] = mapped_column(Float)
    accountant: Mapped[str] = mapped_column(String(16), default="rdp")
    # the one neighbouring relation every number of this account holds under (app.core.privacy.accounting.Relation)
    relation: Mapped[str] = mapped_column(String(32), default="add_or_remove_one_user",
                                          server_default="add_or_remove_one_user")
    # the per-person bound this data set's events also count against
    person_budget_id: Mapped[int] = mapped_column(ForeignKey("person_budgets.id", ondelete="RESTRICT"))
    # the composition of its charged events (app.core.privacy.composition.ComposedState), updated in
    # the transaction of each ledger entry that changes it; ``privrec ledger verify`` replays it
    composed_state: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    dataset: Mapped[Dataset] = relationship()
    person_budget: Mapped[PersonBudget] = relationship()

    __table_args__ = (
        CheckConstraint(RELATIONS_CHECK, name="relation_kind"),
        Index("ix_budget_accounts_person_budget", "person_budget_id"),
        CheckConstraint("epsilon_cap > 0", name="cap_positive"),
        CheckConstraint("delta > 0 AND delta < 1", name="delta_range"),
        CheckConstraint("accountant IN ('rdp', 'pld')", name="accountant_kind"),
    )


class TrainingRun(Base):
    """One training job; its state lives here (the queue only carries the id)."""

    __tablename__ = "training_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="RESTRICT"))
    algorithm: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # calibrated, JSON-safe
    requested_epsilon: Mapped[float] = mapped_column(Float)
    delta: Mapped[float] = mapped_column(Float)
    epsilon_charged: Mapped[float | None] = mapped_column(Float, default=None)  # this run alone (RDP)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    stage: Mapped[str | None] = mapped_column(String(64), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    trigger: Mapped[str] = mapped_column(String(16), default="manual")  # manual | schedule | demo
    actor: Mapped[str] = mapped_column(String(128), default="system")
    idempotency_key: Mapped[str | None] = mapped_column(String(128), default=None)
    # SHA-256 (hex) of the request's actor and body: a key replayed with another body is refused
    request_digest: Mapped[str | None] = mapped_column(String(64), default=None)
    ratings_version: Mapped[int] = mapped_column(BigInteger, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(128), default=None)
    # Set (and committed) before the worker reads the first byte of private data: from then on the
    # run is charged whatever happens (never refunded). Also set for a run whose worker vanished.
    private_data_read: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    refunded: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    # the cohorts (privacy blocks) the run reads, chosen from the ledger and the calendar before
    # any private read (app.ledger.reserve); None for runs reserved before blocks existed
    cohorts: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    # Outbox: when the run's message was last handed to the broker; None while it never was (the
    # broker was down). Worker start-up and the beat send queued runs that were never sent.
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)

    dataset: Mapped[Dataset] = relationship()

    __table_args__ = (
        CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed')", name="status_kind"),
        CheckConstraint("progress >= 0 AND progress <= 1", name="progress_range"),
        UniqueConstraint("dataset_id", "idempotency_key", name="uq_training_runs_idempotency"),
        Index("ix_training_runs_dataset_status", "dataset_id", "status"),
    )


class ModelVersion(Base):
    """An immutable published model (artifact + public metadata); one active per data set."""

    __tablename__ = "model_versions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="RESTRICT"))
    run_id: Mapped[int] = mapped_column(ForeignKey("training_runs.id", ondelete="RESTRICT"), unique=True)
    version: Mapped[int] = mapped_column(Integer)  # 1, 2, ... per data set (the id is global)
    algorithm: Mapped[str] = mapped_column(String(32))
    artifact_path: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    epsilon: Mapped[float] = mapped_column(Float)  # this model's own release (RDP)
    epsilon_pld: Mapped[float | None] = mapped_column(Float, default=None)
    delta: Mapped[float] = mapped_column(Float)
    n_items: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # public (DP) metrics only
    model_metadata: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    active: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    activated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)

    run: Mapped[TrainingRun] = relationship()
    dataset: Mapped[Dataset] = relationship()

    __table_args__ = (
        UniqueConstraint("dataset_id", "version", name="uq_model_versions_dataset_id_version"),
        Index(
            "uq_model_versions_one_active",
            "dataset_id",
            unique=True,
            postgresql_where=text("active"),
            sqlite_where=text("active"),
        ),
    )


class LedgerEntry(Base):
    """Append-only privacy ledger of one budget account, hash-chained per account.

    ``hash = sha256(canonical JSON of the entry's content || prev_hash)``; see ``app.ledger``.
    ``spent_*`` hold the composed epsilon of the whole (non-refunded) history after this entry.
    """

    __tablename__ = "ledger_entries"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("budget_accounts.id", ondelete="RESTRICT"))
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("training_runs.id", ondelete="RESTRICT"), default=None)
    actor: Mapped[str] = mapped_column(String(128))
    event: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    epsilon: Mapped[float | None] = mapped_column(Float, default=None)  # this event alone (RDP)
    spent_rdp: Mapped[float] = mapped_column(Float, default=0.0)
    spent_pld: Mapped[float | None] = mapped_column(Float, default=None)
    epsilon_cap: Mapped[float] = mapped_column(Float)
    delta: Mapped[float] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[str] = mapped_column(String(40))  # ISO-8601 UTC, part of the hash
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)

    __table_args__ = (
        UniqueConstraint("account_id", "seq", name="uq_ledger_entries_account_seq"),
        UniqueConstraint("run_id", "kind", name="uq_ledger_entries_run_kind"),
        CheckConstraint(
            "kind IN ('open', 'reservation', 'commit', 'refund', 'cap_change', 'local')", name="kind_kind"
        ),
    )


class SimilaritySource(Base):
    """A public source of item-item similarities (DP-CMF public data, docs/algorithms.md §3).

    It must declare that it is public (never derived from private users' ratings): the
    ``declared_public`` flag is required to be true and ``provenance`` says where it comes from.
    """

    __tablename__ = "similarity_sources"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    provenance: Mapped[str] = mapped_column(Text)
    declared_public: Mapped[bool] = mapped_column(Boolean)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    __table_args__ = (
        UniqueConstraint("dataset_id", "name", name="uq_similarity_sources_dataset_name"),
        CheckConstraint("declared_public", name="declared_public"),
        CheckConstraint("length(provenance) > 0", name="provenance_given"),
    )


class ItemSimilarity(Base):
    """One public neighbour of an item (top-K lists), with its similarity score."""

    __tablename__ = "item_similarities"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    source_id: Mapped[int] = mapped_column(ForeignKey("similarity_sources.id", ondelete="CASCADE"))
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"))
    neighbour_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"))
    score: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        UniqueConstraint("source_id", "item_id", "neighbour_id", name="uq_item_similarities_source_pair"),
        CheckConstraint("item_id <> neighbour_id", name="not_self"),
        Index("ix_item_similarities_item", "item_id"),
        Index("ix_item_similarities_neighbour", "neighbour_id"),
    )


class PublicRatingConsent(Base):
    """A user's current choice to make their ratings of one data set public (DP-CMF source 3).

    Only the user's own token may change it; every change is appended to
    ``public_rating_consent_events``. A public user's ratings are rows of the public matrix and
    never enter a private statistic.
    """

    __tablename__ = "public_rating_consents"

    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    public: Mapped[bool] = mapped_column(Boolean)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class PublicRatingConsentEvent(Base):
    """Append-only audit of consent changes (who, when, to what)."""

    __tablename__ = "public_rating_consent_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    public: Mapped[bool] = mapped_column(Boolean)
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (Index("ix_public_rating_consent_events_user", "dataset_id", "user_id"),)


class Vote(Base):
    """A thumbs up (+1) or down (-1) of one user for one item (unique per data set, user, item).

    With randomisation at ingestion, ``value`` is the randomised bit, ``randomised`` is true and
    ``local_epsilon`` holds epsilon0; the raw vote is never stored.
    """

    __tablename__ = "votes"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"))
    value: Mapped[int] = mapped_column(Integer)
    randomised: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    local_epsilon: Mapped[float | None] = mapped_column(Float, default=None)
    randomised_by: Mapped[str | None] = mapped_column(String(8), default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    __table_args__ = (
        UniqueConstraint("dataset_id", "user_id", "item_id", name="uq_votes_dataset_user_item"),
        CheckConstraint("value IN (-1, 1)", name="value_sign"),
        CheckConstraint(
            "(randomised AND local_epsilon IS NOT NULL AND local_epsilon > 0 AND randomised_by IN ('server', 'client'))"
            " OR (NOT randomised AND local_epsilon IS NULL AND randomised_by IS NULL)",
            name="randomisation_recorded",
        ),
        Index("ix_votes_user", "user_id"),
        Index("ix_votes_item", "item_id"),
    )


class VoteAllowance(Base):
    """How many randomised bits one user has ever been given in one data set.

    Deleting a randomised vote does not give the allowance back: a later vote would be a fresh
    randomisation, so the user-level guarantee (cap x epsilon0) counts every bit ever stored.
    Deleting the *user* does not either: the row is keyed by ``user_key`` =
    sha256(data set id, external user id) rather than the users row, so a user deleted and
    re-created under the same id cannot collect fresh randomisations of the same votes.
    """

    __tablename__ = "vote_allowances"

    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True)
    user_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    randomised_votes: Mapped[int] = mapped_column(Integer, default=0)

    __table_args__ = (CheckConstraint("randomised_votes >= 0", name="non_negative"),)


class RatingsVersionShard(Base):
    """Striped part of a data set's ``ratings_version``: rating writes add to one of
    ``RATINGS_VERSION_SHARDS`` rows (chosen per connection), so concurrent writers do not queue on
    the data set's row lock until each other's commit."""

    __tablename__ = "ratings_version_shards"

    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    n: Mapped[int] = mapped_column(BigInteger, default=0)
    changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


RATINGS_VERSION_SHARDS = 16


class ReferenceEpoch(Base):
    """One row whose ``n`` changes in every transaction that deletes user, item or data set rows or
    changes their ids or external ids (statement-level triggers, PostgreSQL; migration 0008). It
    starts at a random number, so two databases (or one created again) do not share values.
    Processes cache external id -> row id maps for one epoch (:mod:`app.db.reference_ids`)."""

    __tablename__ = "reference_epoch"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    n: Mapped[int] = mapped_column(BigInteger)

class RevokedToken(Base):
    """A bearer token or dashboard session cut off before its expiry, by its id (``jti``). Verifiers
    refuse it while it lives; the row may be pruned once ``expires_at`` has passed."""

    __tablename__ = "revoked_tokens"

    jti: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    revoked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(String(500), default=None)


Dataset.ratings_version = column_property(
    Dataset.__table__.c.ratings_version
    + select(func.coalesce(func.sum(RatingsVersionShard.n), 0))
    .where(RatingsVersionShard.dataset_id == Dataset.__table__.c.id)
    .correlate_except(RatingsVersionShard)
    .scalar_subquery()
)


def bump_ratings_version(session: Session, dataset_id: int, n: int = 1) -> None:
    """Record that ratings of ``dataset_id`` changed (call in the same transaction as the write)."""
    session.execute(
        update(Dataset)
        .where(Dataset.id == dataset_id)
        .values(ratings_version_base=Dataset.ratings_version_base + n, ratings_changed_at=utcnow())
        .execution_options(synchronize_session=False)
    )


def bump_ratings_version_sharded(session: Session, dataset_id: int, n: int = 1) -> None:
    """``bump_ratings_version`` without the data set's row lock: adds ``n`` to one shard row.

    The shard is the connection's backend id modulo the shard count on PostgreSQL, so concurrent
    transactions (different connections) rarely share a row lock; SQLite has one writer anyway.
    """
    is_pg = session.get_bind().dialect.name == "postgresql"
    shard = func.pg_backend_pid() % RATINGS_VERSION_SHARDS if is_pg else 0
    table = table_of(RatingsVersionShard)
    insert = postgresql.insert if is_pg else sqlite.insert
    stmt = insert(table).values(dataset_id=dataset_id, shard=shard, n=n, changed_at=utcnow())
    session.execute(stmt.on_conflict_do_update(
        index_elements=["dataset_id", "shard"],
        set_={"n": table.c.n + stmt.excluded.n, "changed_at": stmt.excluded.changed_at},
    ))
