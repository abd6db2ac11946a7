"""The ``privrec`` command line: serve, migrate, train, api, worker, beat, import-csv, import-votes,
import-similarities, issue-token, budget, openapi."""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import itertools
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import uvicorn
from alembic.script import ScriptDirectory
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from tqdm import tqdm

from app.api_workers import Supervisor, reuse_port_listeners
from app.auth import Kind, issue_token
from app.config import Settings, get_settings, reset_settings_cache
from app.db.migrate import alembic_config, current_revision, upgrade_head
from app.db.models import Dataset, TrainingRun
from app.db.session import engine_options, get_sessionmaker, session_scope
from app.errors import PrivrecError
from app.main import create_app, openapi_yaml
from app.schemas.admin import TrainingIn
from app.services import admin, budget, catalog, ingest, public_data, votes
from app.services.serving.active import invalidate_catalog
from app.services.training.dispatch import QUEUE
from app.services.unit_of_work import after_commit, commit

__all__ = ["main", "build_parser"]


def _settings(**overrides: Any) -> Settings:
    if not overrides:
        return get_settings()
    return Settings(**overrides)


def _maker(settings: Settings) -> sessionmaker[Session]:
    """The session factory of the database ``settings`` name, built with their engine options."""
    return get_sessionmaker(settings.database_url, engine_options(settings))


def cmd_serve(args: argparse.Namespace) -> int:
    """Embedded mode: SQLite, no Redis, in-process worker, one uvicorn process."""


    # The embedded mode is "no Redis"; overrides go through the environment so that every
    # component reading the process-wide settings (worker, sessions) sees the same values.
    os.environ.pop("REDIS_URL", None)
    if args.data_dir:
        data = Path(args.data_dir).resolve()
        data.mkdir(parents=True, exist_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{data / 'privrec.db'}"
        os.environ["ARTIFACT_DIR"] = str(data / "artifacts")
    if args.no_demo:
        os.environ["SEED_DEMO"] = "false"
    reset_settings_cache()
    settings = get_settings()
    app = create_app(settings)
    if settings.seed_demo:
        threading.Thread(target=announce_demo, args=(settings,), name="privrec-demo-announcer",
                         daemon=True).start()
    uvicorn.run(app, host=args.host or settings.api_host, port=args.port or settings.api_port,
                log_level=settings.log_level.lower())
    return 0


DEMO_USER = "user-5"


def announce_demo(settings, *, interval: float = 1.0, timeout: float | None = None) -> str | None:
    """Wait for the demo data set's first training run (trigger ``demo``) to end and log one line
    saying it was trained (or failed) and one saying how to get a token; return its status.

    The demo is synthetic; the lines carry only the run's id, status and public stage.
    """



    log = logging.getLogger("privrec.cli")
    deadline = None if timeout is None else time.monotonic() + timeout
    run = None
    while deadline is None or time.monotonic() < deadline:
        try:
            with session_scope(settings.database_url, engine_options(settings)) as session:
                run = session.execute(
                    select(TrainingRun.id, TrainingRun.status, TrainingRun.stage).join(Dataset)
                    .where(TrainingRun.trigger == "demo", Dataset.name == settings.default_dataset)
                    .order_by(TrainingRun.id)).first()
        except Exception:  # noqa: BLE001 - the schema may not exist yet while the server starts
            run = None
        if run is not None and run.status in ("succeeded", "failed"):
            break
        time.sleep(interval)
    else:
        return None
    name = settings.default_dataset
    if run.status == "succeeded":
        log.info("demo data set %r is trained: run %d published its model", name, run.id)
    else:
        log.warning("the demo data set %r training run %d failed (see GET /v1/admin/trainings/%d)",
                    name, run.id, run.id)
    log.info("get a user token with `privrec issue-token --user %s`, then GET "
             "/v1/datasets/%s/users/%s/recommendations with it (admin: `privrec issue-token --admin`)",
             DEMO_USER, name, DEMO_USER)
    return run.status


def cmd_api(args: argparse.Namespace) -> int:
    """Production API process(es): uvicorn on the app factory, no in-process worker; with
    ``--workers N``, N processes each on its own ``SO_REUSEPORT`` socket (`app.api_workers`)."""
    settings = _settings()
    host, port = args.host or settings.api_host, args.port or settings.api_port
    options = _server_options(settings)
    if args.workers <= 1:
        uvicorn.run("app.main:create_app_from_env", factory=True, host=host, port=port, **options)
        return 0
    config = uvicorn.Config("app.main:create_app_from_env", factory=True, host=host, port=port,
                            workers=args.workers, **options)
    try:
        sockets = reuse_port_listeners(host, port, args.workers)
    except OSError as exc:
        raise SystemExit(f"privrec api: cannot listen on {host}:{port} ({exc.strerror})") from None
    return Supervisor(config, sockets).run()


def _server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the API processes: its own access log off (the app writes one JSON
    line per request with the route template, never the raw path, which can name a user); event
    loop and HTTP parser "auto" pick uvloop and httptools (``uvicorn[standard]``) where installed.
    The supervisor kills a worker that has not answered its ping within ``WORKER_HEALTHCHECK_S``;
    uvicorn's 5 s default is shorter than a spawned worker's start on a loaded machine, which
    then never came up (killed and respawned forever)."""
    return {"log_level": settings.log_level.lower(), "access_log": False, "loop": "auto", "http": "auto",
            "timeout_worker_healthcheck": WORKER_HEALTHCHECK_S}


WORKER_HEALTHCHECK_S = 60


def _celery(argv: list[str]) -> int:
    exe = shutil.which("celery") or str(Path(sys.executable).with_name("celery"))
    os.execv(exe, [exe, "-A", "workers.celery_app", *argv])
    return 0  # pragma: no cover - execv does not return


def cmd_worker(args: argparse.Namespace) -> int:
    """A Celery worker for training runs (prefetch 1; tasks acknowledged late)."""
    argv = ["worker", "--loglevel", args.loglevel, "--concurrency", str(args.concurrency),
            "--prefetch-multiplier", "1", "-Q", QUEUE]
    if args.hostname:
        argv += ["--hostname", args.hostname]
    return _celery(argv)


def cmd_beat(args: argparse.Namespace) -> int:
    """Celery beat: periodic retraining (interval from RETRAIN_INTERVAL_S)."""
    return _celery(["beat", "--loglevel", args.loglevel])


def cmd_migrate(_: argparse.Namespace) -> int:
    """Apply the Alembic migrations up to head and say which revisions were applied."""
    settings = _settings()
    before = current_revision(settings.database_url)
    upgrade_head(settings.database_url)
    applied = _revisions_between(before, current_revision(settings.database_url))
    with session_scope(settings.database_url, engine_options(settings)) as session:
        ds = budget.bootstrap(session, settings)
        name = ds.name
    done = f"applied {', '.join(applied)}" if applied else "already at the latest schema"
    print(f"{done}; default data set {name!r} is ready")
    return 0


def _revisions_between(before: str | None, after: str | None) -> list[str]:
    """The migration revisions above ``before`` up to ``after``, oldest first."""


    if after is None or after == before:
        return []
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return [rev.revision for rev in reversed(list(script.iterate_revisions(after, before or "base")))]


def cmd_train(args: argparse.Namespace) -> int:
    """Submit a training run over the admin API's service path (reserve, commit, enqueue) and
    print its id; with ``--follow`` show its data-independent stages until it ends."""


    settings = _settings()
    try:
        body = TrainingIn(algorithm=args.algorithm, epsilon=args.epsilon, objective=args.objective)
    except ValidationError as exc:
        raise SystemExit(f"privrec train: {_config_errors(exc)}; nothing was submitted") from None
    with _maker(settings)() as session:
        run_id = admin.start_training(session, dataset=args.dataset, body=body,
                                      actor=f"cli:{os.environ.get('USER', 'unknown')}")
        commit(session)
    sent = admin.enqueue(run_id, settings)
    print(json.dumps({"run_id": run_id, "status": "queued", "enqueued": sent}), flush=True)
    if not args.follow:
        return 0
    try:
        status = _follow(run_id, settings, interval=args.interval, quiet=args.quiet)
    except KeyboardInterrupt:
        raise SystemExit(f"privrec train: stopped following run {run_id}; the run goes on "
                         f"(GET /v1/admin/trainings/{run_id})") from None
    return 0 if status == "succeeded" else 1


def _follow(run_id: int, settings, *, interval: float, quiet: bool) -> str:
    """Poll run ``run_id`` until it succeeds or fails, drawing its public progress (stage names
    and data-independent fractions only, as the dashboard shows); return the final status."""



    maker = _maker(settings)
    bar = tqdm(total=100, unit="%", desc=f"run {run_id}: queued", disable=quiet,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}]")
    try:
        while True:
            with maker() as session:
                run = admin.run_view(session, run_id=run_id).model_dump(mode="json")
            bar.set_description_str(f"run {run_id}: {run.get('stage') or run['status']}", refresh=False)
            bar.update(max(0, round(100 * run["progress"]) - bar.n))
            if run["status"] in ("succeeded", "failed"):
                break
            time.sleep(interval)
    finally:
        bar.close()
    print(json.dumps({key: run.get(key) for key in ("id", "status", "stage", "epsilon_charged", "error")}))
    return run["status"]


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _csv_lines(path: Path, delimiter: str, header: bool) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every non-empty data line of a (possibly gzipped) CSV."""
    with _open_text(path) as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        if header:
            next(reader, None)
        for line_no, row in enumerate(reader, start=2 if header else 1):
            if row:
                yield line_no, row


def _rows(path: Path, delimiter: str, header: bool,
          columns: str = "user,item,rating") -> Iterator[tuple[str, str, float]]:
    for line_no, row in _csv_lines(path, delimiter, header):
        if len(row) < 3:
            raise SystemExit(f"{path}:{line_no}: expected {columns}")
        try:
            value = float(row[2])
        except ValueError:
            raise SystemExit(f"{path}:{line_no}: {columns.rsplit(',', 1)[-1]} is not a number") from None
        yield row[0].strip(), row[1].strip(), value


def _count_data_lines(path: Path, header: bool) -> int:
    """Lines of a (possibly gzipped) text file, less the header: the bar's total, counted in one
    fast pass over raw bytes before the import (blank lines are counted too; the bar is trued up
    when the import ends)."""
    opener = gzip.open if path.suffix == ".gz" else open
    lines, last = 0, b"\n"
    with opener(path, "rb") as fh:
        while block := fh.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    lines += last != b"\n"
    return max(lines - int(header), 0)


def _bar(path: Path, total: int, unit: str, quiet: bool):
    """A progress bar with total, percent and ETA, used as a context manager so that it is closed
    exactly once, before any error message (no second copy of the bar after it)."""
    return tqdm(total=total, unit=unit, desc=f"import {path.name}", disable=quiet,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]")


def _finish(bar) -> None:
    """True the bar up to the rows actually read (blank lines were counted in its total)."""
    if bar.total != bar.n:
        bar.total = bar.n
        bar.refresh()


def cmd_import_csv(args: argparse.Namespace) -> int:
    """Upsert ratings from a CSV (user,item,rating[,...]) with a progress bar."""
    settings = _settings()
    path = Path(args.path)
    if not path.exists():
        raise SystemExit(f"no such file: {path}")
    maker = _maker(settings)
    total = 0
    chunk: list[tuple[str, str, float]] = []
    with _bar(path, _count_data_lines(path, not args.no_header), "ratings", args.quiet) as bar:

        def flush() -> None:
            nonlocal total
            with maker() as session:
                try:
                    result = ingest.import_ratings(session, dataset=args.dataset, rows=chunk)
                except PrivrecError as exc:
                    exc.message = (f"{exc.message} (this chunk of {len(chunk)} rows; the {total} rows "
                                   f"before it were imported)")
                    raise
                commit(session)
            total += result
            bar.update(len(chunk))
            chunk.clear()

        for row in _rows(path, args.delimiter, not args.no_header):
            chunk.append(row)
            if len(chunk) >= args.chunk:
                flush()
        if chunk:
            flush()
        _finish(bar)
    print(json.dumps({"dataset": args.dataset, "rows": total}))
    return 0


def _item_rows(path: Path, delimiter: str, header: bool) -> Iterator[tuple[str, str | None, list[str]]]:
    """(item id, title or None, categories) rows of ``item_id[,title[,cat1|cat2...]]``."""
    for line_no, row in _csv_lines(path, delimiter, header):
        item_id = row[0].strip()
        if not item_id:
            raise SystemExit(f"{path}:{line_no}: expected item_id[,title[,categories separated by |]]; "
                             "nothing more was written")
        title = (row[1].strip() or None) if len(row) > 1 else None
        if title is not None and len(title) > 512:
            raise SystemExit(f"{path}:{line_no}: titles have at most 512 characters; nothing more was written")
        categories = [c.strip() for c in row[2].split("|") if c.strip()] if len(row) > 2 else []
        yield item_id, title, categories


def cmd_import_items(args: argparse.Namespace) -> int:
    """Upsert public catalogue items from a CSV (item_id[,title[,categories separated by |]]):
    the only bulk way to create items (ratings and votes imports refuse unknown items)."""
    path = Path(args.path)
    if not path.exists():
        raise SystemExit(f"no such file: {path}")
    maker = _maker(_settings())
    totals = {"created": 0, "updated": 0}
    rows = _item_rows(path, args.delimiter, not args.no_header)
    while chunk := list(itertools.islice(rows, args.chunk)):
        with maker() as session:
            out = catalog.import_items(session, dataset=args.dataset, rows=chunk)
            after_commit(session, partial(invalidate_catalog, args.dataset))
            commit(session)
        totals = {key: totals[key] + out[key] for key in totals}
    print(json.dumps({"dataset": args.dataset, **totals}))
    return 0


def _vote_rows(path: Path, delimiter: str, header: bool) -> Iterator[tuple[str, str, int]]:
    """(user, item, vote) rows of a CSV; the vote must read exactly 1, +1 or -1."""
    for line_no, row in _csv_lines(path, delimiter, header):
        vote = {"1": 1, "+1": 1, "-1": -1}.get(row[2].strip()) if len(row) >= 3 else None
        if vote is None:
            raise SystemExit(f"{path}:{line_no}: expected user,item,vote with vote 1 or -1; nothing more was written")
        yield row[0].strip(), row[1].strip(), vote


def cmd_import_votes(args: argparse.Namespace) -> int:
    """Store votes from a CSV (user,item,vote) through the ingestion path, with a progress bar: on
    a data set that randomises at ingestion each vote is randomised once on arrival and only the
    bit is kept."""
    path = Path(args.path)
    if not path.exists():
        raise SystemExit(f"no such file: {path}")
    maker = _maker(_settings())
    totals = {"created": 0, "updated": 0, "unchanged": 0}
    rows = _vote_rows(path, args.delimiter, not args.no_header)
    with _bar(path, _count_data_lines(path, not args.no_header), "votes", args.quiet) as bar:
        while chunk := list(itertools.islice(rows, args.chunk)):
            with maker() as session:
                out = votes.import_votes(session, dataset=args.dataset, rows=chunk)
                commit(session)
            totals = {key: totals[key] + out[key] for key in totals}
            bar.update(len(chunk))
        _finish(bar)
    print(json.dumps({"dataset": args.dataset, **totals}))
    return 0


def cmd_import_similarities(args: argparse.Namespace) -> int:
    """Create/update a public similarity source and replace the top-K lists of the items in a CSV
    (item_id,neighbour_id,score), all or nothing."""
    path = Path(args.path)
    if not path.exists():
        raise SystemExit(f"no such file: {path}")
    lists: dict[str, list[tuple[str, float]]] = {}
    for item, neighbour, score in _rows(path, args.delimiter, not args.no_header, "item_id,neighbour_id,score"):
        lists.setdefault(item, []).append((neighbour, score))
    with _maker(_settings())() as session:
        source, _ = public_data.put_similarity_source(
            session, dataset=args.dataset, name=args.source, provenance=args.provenance,
            declared_public=args.declare_public, actor=f"cli:{os.environ.get('USER', 'unknown')}")
        out = public_data.replace_neighbours(session, dataset=args.dataset, source=args.source,
                                             rows=list(lists.items()), max_rows=None)
        commit(session)
    print(json.dumps({"dataset": args.dataset, **out.model_dump(), "provenance": source.provenance}))
    return 0


def cmd_issue_token(args: argparse.Namespace) -> int:
    """Print a signed bearer token."""
    settings = _settings()
    kind: Kind
    if args.admin:
        kind, subject, scopes = "admin", args.subject or "admin", []
    elif args.service:
        if not args.scope:
            raise SystemExit("privrec issue-token: a service token needs at least one --scope "
                             "(act_for_users, ingest)")
        kind, subject, scopes = "service", args.service, args.scope
    elif args.user:
        kind, subject, scopes = "user", args.user, []
    else:
        raise SystemExit("choose one of --user ID, --service NAME or --admin")
    ttl = args.ttl or settings.access_token_ttl_s
    if not 0 < ttl <= settings.max_token_ttl_s:
        raise SystemExit(f"privrec issue-token: --ttl must be between 1 and MAX_TOKEN_TTL_S "
                         f"({settings.max_token_ttl_s} s)")
    token = issue_token(subject, secret=settings.secret_key, kind=kind, scopes=scopes, ttl_seconds=ttl,
                        algorithm=settings.jwt_algorithm, max_lifetime_s=settings.max_token_ttl_s)
    print(token)
    return 0


def cmd_budget(args: argparse.Namespace) -> int:
    """Print the privacy budget of a data set as JSON."""
    settings = _settings()
    maker = _maker(settings)
    with maker() as session:
        out = admin.budget_view(session, dataset=args.dataset or settings.default_dataset)
    print(json.dumps(out.model_dump(mode="json"), indent=2))
    return 0


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    """Replay the ledgers: every hash chain, stored spend and stored composed state (equal to the
    replay, within its cap), one JSON line per account and person budget; exit 1 on any failure."""
    from app.services.budget import verify_all

    with _maker(_settings())() as session:
        results = verify_all(session, dataset=args.dataset)
    for result in results:
        print(json.dumps(result))
    return 0 if all(r["ok"] for r in results) else 1


def cmd_openapi(args: argparse.Namespace) -> int:
    """Print the OpenAPI document the app serves, as YAML (``privrec openapi > openapi.yaml``)."""
    sys.stdout.write(openapi_yaml())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="privrec", description="Differentially private recommendations.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="embedded mode: SQLite, in-process worker, demo data")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--data-dir", help="folder for the SQLite file and artifacts (default ./var)")
    s.add_argument("--no-demo", action="store_true", help="do not seed the synthetic demo data set")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("api", help="production API (DATABASE_URL, REDIS_URL)")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(func=cmd_api)

    s = sub.add_parser("worker", help="Celery training worker")
    s.add_argument("--concurrency", type=int, default=1)
    s.add_argument("--loglevel", default="INFO")
    s.add_argument("--hostname")
    s.set_defaults(func=cmd_worker)

    s = sub.add_parser("beat", help="Celery beat (periodic retraining)")
    s.add_argument("--loglevel", default="INFO")
    s.set_defaults(func=cmd_beat)

    s = sub.add_parser("train", help="start a training run (budget reserved now) and optionally follow it")
    s.add_argument("--dataset", default="default")
    s.add_argument("--epsilon", type=float, required=True, help="epsilon for this run")
    s.add_argument("--algorithm", default="dpals", help="dpals (default), dpfw, dpcmf or onebit")
    s.add_argument("--objective", choices=["rating", "ranking"])
    s.add_argument("--follow", action="store_true",
                   help="show the run's stages until it is published (exit 0) or fails (exit 1)")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between polls with --follow")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("migrate", help="apply database migrations")
    s.set_defaults(func=cmd_migrate)

    s = sub.add_parser("import-items", help="upsert public catalogue items from a CSV "
                                            "(item_id[,title[,categories separated by |]])")
    s.add_argument("path")
    s.add_argument("--dataset", default="default")
    s.add_argument("--delimiter", default=",")
    s.add_argument("--no-header", action="store_true")
    s.add_argument("--chunk", type=int, default=10_000, choices=range(1, 100_001), metavar="1..100000")
    s.set_defaults(func=cmd_import_items)

    s = sub.add_parser("import-csv", help="upsert ratings from a CSV file (.csv or .csv.gz); every item must "
                                          "already be in the catalogue (import-items)")
    s.add_argument("path")
    s.add_argument("--dataset", default="default")
    s.add_argument("--delimiter", default=",")
    s.add_argument("--no-header", action="store_true")
    s.add_argument("--chunk", type=int, default=10_000)
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(func=cmd_import_csv)

    s = sub.add_parser("import-votes", help="store thumbs up/down votes from a CSV (user,item,vote with vote "
                       "1 or -1), randomised on arrival where the data set says so; chunks are all or nothing")
    s.add_argument("path")
    s.add_argument("--dataset", default="default")
    s.add_argument("--delimiter", default=",")
    s.add_argument("--no-header", action="store_true")
    s.add_argument("--chunk", type=int, default=10_000, choices=range(1, 10_001), metavar="1..10000")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_import_votes)

    s = sub.add_parser("import-similarities",
                       help="replace items' top-K lists of a PUBLIC similarity source from a CSV "
                       "(item_id,neighbour_id,score), all or nothing")
    s.add_argument("path")
    s.add_argument("--dataset", default="default")
    s.add_argument("--source", required=True, help="source name (created when new)")
    s.add_argument("--provenance", required=True, help="where the similarities come from (URL or citation)")
    s.add_argument("--declare-public", action="store_true",
                   help="required: declare that the similarities are public, not derived from private ratings")
    s.add_argument("--delimiter", default=",")
    s.add_argument("--no-header", action="store_true")
    s.set_defaults(func=cmd_import_similarities)

    s = sub.add_parser("issue-token", help="print a signed bearer token")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--user", help="user token: subject is this external user id")
    g.add_argument("--service", help="service token named NAME (requires at least one --scope)")
    g.add_argument("--admin", action="store_true", help="admin token")
    s.add_argument("--scope", action="append", choices=["act_for_users", "ingest"])
    s.add_argument("--subject", help="subject of an admin token (default 'admin')")
    s.add_argument("--ttl", type=int, help="lifetime in seconds (default ACCESS_TOKEN_TTL_S)")
    s.set_defaults(func=cmd_issue_token)

    s = sub.add_parser("budget", help="print a data set's privacy budget")
    s.add_argument("--dataset")
    s.set_defaults(func=cmd_budget)

    s = sub.add_parser("ledger", help="privacy ledger tools")
    ledger_sub = s.add_subparsers(dest="ledger_command", required=True)
    s = ledger_sub.add_parser("verify", help="replay the ledgers: hash chains, spends and composed states")
    s.add_argument("--dataset", help="only this data set (and its person budget)")
    s.set_defaults(func=cmd_ledger_verify)

    s = sub.add_parser("openapi", help="print the OpenAPI document as YAML")
    s.set_defaults(func=cmd_openapi)
    return p


def main(argv: Sequence[str] | None = None) -> int:


    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PrivrecError as exc:
        detail = f" {json.dumps(exc.details, default=str)[:2000]}" if exc.details else ""
        raise SystemExit(f"privrec {args.command}: {exc.message}{detail}") from None
    except ValidationError as exc:  # settings: one line, never the rejected value (e.g. a secret)
        raise SystemExit(f"privrec {args.command}: configuration error: {_config_errors(exc)}") from None
    except (OperationalError, InterfaceError) as exc:
        raise SystemExit(f"privrec {args.command}: the database (DATABASE_URL) is unreachable or missing "
                         f"({type(exc.orig).__name__ if exc.orig is not None else type(exc).__name__})") from None


def _config_errors(exc: ValidationError) -> str:
    """Every settings error as ``FIELD: message``, without the input values."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        field = ".".join(str(x) for x in err.get("loc", ())).upper()
        parts.append(f"{field}: {err['msg']}" if field else err["msg"])
    return "; ".join(parts)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
