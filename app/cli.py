"""The ``privrec`` command line: serve, migrate, train, api, worker, beat, import-items, import-csv,
import-votes, import-similarities, issue-token, revoke-token, budget, retrain-policy, openapi, healthcheck.

Each command imports what it uses when it runs, so that ``--help`` and ``issue-token`` start at
once (no web app, database, migration or numeric library)."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import csv
import getpass
import gzip
import io
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.errors import PrivrecError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from app.config import Settings

__all__ = ["main", "build_parser"]


def _settings() -> Settings:
    """The process settings (validated once per process)."""
    from app.config import get_settings

    return get_settings()


def _maker(settings: Settings) -> sessionmaker[Session]:
    """The session factory of the database ``settings`` name, built with their engine options."""
    from app.db.session import engine_options, get_sessionmaker

    return get_sessionmaker(settings.database_url, engine_options(settings))


def _actor() -> str:
    """``cli:<login name>`` of whoever runs the command: the environment's login name, else the
    account database's entry for this process's user id, else the bare uid."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no LOGNAME/USER/LNAME/USERNAME and no passwd entry (e.g. a bare container uid)
        return f"cli:uid-{os.getuid()}"


def cmd_serve(args: argparse.Namespace) -> int:
    """Embedded mode: SQLite, no Redis, in-process worker, one uvicorn process."""
    import threading

    import uvicorn

    from app.config import get_settings, reset_settings_cache
    from app.logging_setup import uvicorn_log_options
    from app.main import create_app

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
                **uvicorn_log_options(settings))
    return 0


DEMO_USER = "user-5"


def announce_demo(settings, *, interval: float = 1.0, timeout: float | None = None) -> str | None:
    """Wait for the demo data set's first training run (trigger ``demo``) to end and log one line
    saying it was trained (or failed) and one saying how to get a token; return its status.

    The demo is synthetic; the lines carry only the run's id, status and public stage.
    """
    from sqlalchemy import select

    from app.db.models import Dataset, TrainingRun
    from app.db.session import engine_options, session_scope

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
    import uvicorn

    from app import api_workers
    from app.logging_setup import uvicorn_log_options

    settings = _settings()
    host, port = args.host or settings.api_host, args.port or settings.api_port
    options = {**_server_options(settings), **uvicorn_log_options(settings)}
    _fresh_metrics_dir()
    if args.workers <= 1:
        uvicorn.run("app.main:create_app_from_env", factory=True, host=host, port=port, **options)
        return 0
    config = uvicorn.Config("app.main:create_app_from_env", factory=True, host=host, port=port,
                            workers=args.workers, **options)
    try:
        sockets = api_workers.reuse_port_listeners(host, port, args.workers)
    except OSError as exc:
        raise SystemExit(f"privrec api: cannot listen on {host}:{port} ({exc.strerror})") from None
    return api_workers.Supervisor(config, sockets).run()


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


def _fresh_metrics_dir() -> None:
    """Create ``PROMETHEUS_MULTIPROC_DIR`` when set and remove the previous run's files from it
    (prometheus_client's multi-process mode sums every file there: a restarted container must not
    count its dead processes)."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for stale in Path(folder).glob("*.db"):
        stale.unlink(missing_ok=True)


#: ``privrec healthcheck``: how old beat's schedule file may grow before beat counts as stuck; beat
#: rewrites it every 3 minutes while it sends tasks (the stale-run reap goes out every few seconds).
BEAT_SCHEDULE_MAX_AGE_S = 600
ROLES = ("api", "worker", "beat")


def cmd_healthcheck(args: argparse.Namespace) -> int:
    """Exit 0 when this container's role is healthy (the image's HEALTHCHECK): ``api`` answers
    ``/health``; ``worker`` reaches its broker; ``beat`` reaches its broker and has rewritten its
    schedule file lately. Without ``ROLE`` the role is the command PID 1 runs (``tini -- privrec
    ROLE``); one-off commands (``migrate``, ...) are healthy. Never probes HTTP outside ``api``."""
    role = args.role or _container_role()
    if role not in ROLES:
        return 0
    settings = _settings()
    problem = {"api": _api_problem, "worker": _broker_problem, "beat": _beat_problem}[role](settings)
    if problem:
        print(f"privrec healthcheck {role}: {problem}", file=sys.stderr)
        return 1
    return 0


def _container_role() -> str | None:
    """The ``privrec`` command PID 1 runs, if any."""
    try:
        return role_of(Path("/proc/1/cmdline").read_bytes())
    except OSError:
        return None


def role_of(cmdline: bytes) -> str | None:
    """The ``privrec`` command of a NUL-separated command line (``tini -- privrec worker`` -> ``worker``)."""
    argv = cmdline.rstrip(b"\0").decode(errors="replace").split("\0")
    names = [Path(a).name for a in argv]
    return argv[names.index("privrec") + 1] if "privrec" in names[:-1] else None


def _api_problem(settings: Settings) -> str | None:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{settings.api_port}/health", timeout=3) as resp:
            return None if resp.status == 200 else f"/health answered {resp.status}"
    except OSError as exc:
        return f"/health does not answer ({exc})"


def _broker_problem(settings: Settings) -> str | None:
    if not settings.redis_url:
        return "REDIS_URL is not set"
    import redis

    try:
        redis.Redis.from_url(settings.redis_url, socket_timeout=3, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        return f"the broker (REDIS_URL) does not answer ({type(exc).__name__})"
    return None


def _beat_problem(settings: Settings) -> str | None:
    if problem := _broker_problem(settings):
        return problem
    path = settings.beat_schedule_file  # the dbm module in use may add a suffix
    written = [f.stat().st_mtime for f in path.parent.glob(f"{path.name}*") if f.is_file()]
    age = time.time() - max(written, default=0.0)
    if age > BEAT_SCHEDULE_MAX_AGE_S:
        return f"the schedule file {path} was not rewritten for {BEAT_SCHEDULE_MAX_AGE_S} s"
    return None


def _celery(argv: list[str]) -> int:
    exe = shutil.which("celery") or str(Path(sys.executable).with_name("celery"))
    os.execv(exe, [exe, "-A", "workers.celery_app", *argv])
    return 0  # pragma: no cover - execv does not return


def cmd_worker(args: argparse.Namespace) -> int:
    """A Celery worker for training runs (prefetch 1; tasks acknowledged late)."""
    from app.services.training.dispatch import QUEUE

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
    from app.db.migrate import current_revision, upgrade_head
    from app.db.session import engine_options, session_scope
    from app.services import budget

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
    from alembic.script import ScriptDirectory

    from app.db.migrate import alembic_config

    if after is None or after == before:
        return []
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return [rev.revision for rev in reversed(list(script.iterate_revisions(after, before or "base")))]


def cmd_train(args: argparse.Namespace) -> int:
    """Submit a training run over the admin API's service path (reserve, commit, enqueue) and
    print its id; with ``--follow`` show its data-independent stages until it ends."""
    from pydantic import ValidationError

    from app.schemas.admin import TrainingIn
    from app.services import admin
    from app.services.unit_of_work import commit

    settings = _settings()
    try:
        body = TrainingIn(algorithm=args.algorithm, epsilon=args.epsilon, objective=args.objective)
    except ValidationError as exc:
        raise SystemExit(f"privrec train: {_config_errors(exc)}; nothing was submitted") from None
    with _maker(settings)() as session:
        run_id = admin.start_training(session, dataset=args.dataset, body=body,
                                      actor=_actor())
        commit(session)
    sent = admin.enqueue(run_id, settings)
    print(json.dumps({"run_id": run_id, "status": "queued", "enqueued": sent}), flush=True)
    if not args.follow:
        return 0
    with _interrupt_flag() as stop:
        status = _follow(run_id, settings, interval=args.interval, quiet=args.quiet, stop=stop)
    if status is None:
        raise SystemExit(f"privrec train: stopped following run {run_id}; the run goes on "
                         f"(GET /v1/admin/trainings/{run_id})")
    return 0 if status == "succeeded" else 1


@contextlib.contextmanager
def _interrupt_flag() -> Iterator[threading.Event]:
    """Ctrl-C sets the flag yielded instead of raising ``KeyboardInterrupt`` in whatever call is
    running: an exception raised inside a library's database call may be caught and dropped there,
    and the loop would then poll for ever. A SIGINT the shell set to be ignored stays ignored."""
    stop = threading.Event()
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield stop
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _follow(run_id: int, settings, *, interval: float, quiet: bool, stop: threading.Event) -> str | None:
    """Poll run ``run_id`` until it succeeds or fails, drawing its public progress (stage names
    and data-independent fractions only, as the dashboard shows); return the final status, or
    None once ``stop`` is set (the run goes on)."""
    from tqdm import tqdm

    from app.services import admin

    maker = _maker(settings)
    bar = tqdm(total=100, unit="%", desc=f"run {run_id}: queued", disable=quiet,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}]")
    try:
        while not stop.is_set():
            with maker() as session:
                run = admin.run_view(session, run_id=run_id).model_dump(mode="json")
            bar.set_description_str(f"run {run_id}: {run.get('stage') or run['status']}", refresh=False)
            bar.update(max(0, round(100 * run["progress"]) - bar.n))
            if run["status"] in ("succeeded", "failed"):
                break
            stop.wait(interval)
        else:
            return None
    finally:
        bar.close()
    print(json.dumps({key: run.get(key) for key in ("id", "status", "stage", "epsilon_charged", "error")}))
    return run["status"]


@dataclass(frozen=True)
class _Input:
    """An import command's input file (``.gz`` read through gzip) and how to read it."""

    path: Path
    delimiter: str
    header: bool
    encoding: str

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Input:
        path = Path(args.path)
        if not path.is_file():
            raise SystemExit(f"no such file: {path}")
        return cls(path, args.delimiter, not args.no_header, args.encoding)

    def open_binary(self) -> gzip.GzipFile | io.BufferedReader:
        return gzip.open(self.path, "rb") if self.path.suffix == ".gz" else open(self.path, "rb")


_UNREADABLE = (OSError, EOFError, zlib.error)  # a truncated or corrupt gzip stream, an I/O error


def _unreadable(src: _Input, exc: BaseException) -> str:
    kind = "gzip file" if src.path.suffix == ".gz" else "file"
    return f"{src.path}: not a readable {kind} ({type(exc).__name__}); nothing was written"


def _csv_lines(src: _Input) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every non-empty data line of a (possibly gzipped) CSV; a line
    holding a NUL character, undecodable text or a corrupt gzip stream stops it with one line."""
    with io.TextIOWrapper(src.open_binary(), encoding=src.encoding, newline="") as fh:
        reader = csv.reader(fh, delimiter=src.delimiter)
        try:
            if src.header:
                next(reader, None)
            for row in reader:
                if any("\x00" in field for field in row):
                    raise SystemExit(f"{src.path}:{reader.line_num}: a NUL character; nothing was written")
                if row:
                    yield reader.line_num, row
        except csv.Error as exc:
            raise SystemExit(f"{src.path}:{reader.line_num}: {exc}; nothing was written") from None
        except UnicodeDecodeError:
            raise SystemExit(_undecodable(src, reader.line_num + 1)) from None
        except _UNREADABLE as exc:
            raise SystemExit(_unreadable(src, exc)) from None


def _rows(src: _Input, columns: str = "user,item,rating") -> Iterator[tuple[str, str, float]]:
    for line_no, row in _csv_lines(src):
        if len(row) < 3:
            raise SystemExit(f"{src.path}:{line_no}: expected {columns}")
        try:
            value = float(row[2])
        except ValueError:
            raise SystemExit(f"{src.path}:{line_no}: {columns.rsplit(',', 1)[-1]} is not a number") from None
        yield row[0].strip(), row[1].strip(), value


def _count_data_lines(src: _Input) -> int:
    """Lines of a (possibly gzipped) text file, less the header: the bar's total, counted in one
    fast pass over raw bytes before the import (blank lines are counted too; the bar is trued up
    when the import ends). The same pass checks that the whole file decodes in ``src.encoding``,
    so that a wrong encoding stops the import before anything is written."""
    decoder = codecs.getincrementaldecoder(src.encoding)()
    lines, last = 0, b"\n"
    try:
        with src.open_binary() as fh:
            while block := fh.read(1 << 20):
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as exc:
                    raise SystemExit(_undecodable(src, lines + block[:max(exc.start, 0)].count(b"\n") + 1)) from None
                lines += block.count(b"\n")
                last = block[-1:]
    except _UNREADABLE as exc:
        raise SystemExit(_unreadable(src, exc)) from None
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise SystemExit(_undecodable(src, lines + 1)) from None
    lines += last != b"\n"
    return max(lines - int(src.header), 0)


def _undecodable(src: _Input, line_no: int) -> str:
    return (f"{src.path}:{line_no}: not {src.encoding} text; nothing was written "
            f"(name the file's encoding with --encoding, e.g. --encoding latin-1)")


def _bar(src: _Input, unit: str, quiet: bool):
    """A progress bar with total, percent and ETA, used as a context manager so that it is closed
    exactly once, before any error message (no second copy of the bar after it)."""
    from tqdm import tqdm

    return tqdm(total=_count_data_lines(src), unit=unit, desc=f"import {src.path.name}", disable=quiet,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]")


def _finish(bar) -> None:
    """True the bar up to the rows actually read (blank lines were counted in its total)."""
    if bar.total != bar.n:
        bar.total = bar.n
        bar.refresh()


def _import_chunks(args: argparse.Namespace, src: _Input, unit: str, chunks: Iterator[list[Any]],
                   write: Callable[[Session, list[Any]], Any]) -> list[Any]:
    """Write every chunk; return what each write returned. By default all chunks go in one
    transaction, so a bad row anywhere (or any failure) writes nothing; with ``--partial`` each
    chunk commits on its own and a failure says exactly how many rows were kept. Either way the
    failure is one line."""
    from app.services.unit_of_work import commit

    outs: list[Any] = []
    kept = 0
    session = _maker(_settings())()
    try:
        with _bar(src, unit, args.quiet) as bar:
            try:
                for chunk in chunks:
                    outs.append(write(session, chunk))
                    if args.partial:
                        commit(session)
                        kept += len(chunk)
                    bar.update(len(chunk))
                commit(session)
            except (SystemExit, Exception) as exc:
                session.rollback()
                message = str(exc.code) if isinstance(exc, SystemExit) else _expected_failure(exc)
                if message is None:
                    raise  # a bug: its traceback
                if not isinstance(exc, SystemExit):
                    message = f"privrec {args.command}: {message}"
                raise SystemExit(_import_failure(message, kept if args.partial else None)) from None
            _finish(bar)
    finally:
        session.close()
    return outs


def _import_failure(message: str, kept: int | None) -> str:
    """The one line an import failure prints: what went wrong, and what was written (nothing, or
    with ``--partial`` the first ``kept`` rows)."""
    for said in ("; nothing was written", "; nothing more was written"):
        message = message.replace(said, "")
    if kept is None:
        return f"{message}; nothing was written (the import is all or nothing)"
    return f"{message}; the first {kept} rows were written and kept (--partial), nothing after them"


def cmd_import_csv(args: argparse.Namespace) -> int:
    """Upsert ratings from a CSV (user,item,rating[,...]) with a progress bar, all or nothing
    (``--partial``: chunk by chunk, saying what was kept)."""
    from app.services import ingest

    src = _Input.of(args)
    rows = _rows(src)
    chunks = iter(lambda: list(itertools.islice(rows, args.chunk)), [])
    outs = _import_chunks(args, src, "ratings", chunks,
                          lambda session, chunk: ingest.import_ratings(session, dataset=args.dataset, rows=chunk))
    print(json.dumps({"dataset": args.dataset, "rows": sum(outs)}))
    return 0


@dataclass(frozen=True)
class _ItemColumns:
    """Where an item's fields sit on a catalogue line (0-based; None: not in the file): its id, its
    title, a column of categories separated by ``|``, and columns of 0/1 flags naming a category each
    (MovieLens's genres)."""

    item_id: int
    title: int | None
    categories: int | None
    flags: tuple[int, ...] = ()
    flag_names: tuple[str, ...] = ()

    @classmethod
    def of(cls, args: argparse.Namespace, src: _Input) -> _ItemColumns:
        flags = _column_range(args.category_flags) if args.category_flags else ()
        if args.category_names is not None and not flags:
            raise SystemExit("privrec import-items: --category-names needs --category-flags FIRST-LAST")
        names = tuple(n.strip() for n in args.category_names.split(",")) if args.category_names else None
        if names is None and flags:
            if not src.header:
                raise SystemExit("privrec import-items: --category-flags without a header line needs "
                                 "--category-names NAME,NAME,... (one per flag column)")
            header = next(iter(_header(src)), [])
            names = tuple(header[c].strip() if c < len(header) else "" for c in flags)
        if flags and (names is None or len(names) != len(flags) or not all(names)):
            raise SystemExit(f"privrec import-items: --category-flags names {len(flags)} columns; "
                             f"give a non-empty name for each (--category-names or the header line)")
        categories = args.categories_column if args.categories_column is not None else (0 if flags else 3)
        return cls(item_id=args.id_column - 1, title=(args.title_column or None) and args.title_column - 1,
                   categories=(categories or None) and categories - 1, flags=flags, flag_names=names or ())

    @property
    def width(self) -> int:
        """The fewest fields a line must have."""
        return 1 + max(c for c in (self.item_id, self.title, self.categories, *self.flags) if c is not None)


def _column_range(text: str) -> tuple[int, ...]:
    """``FIRST-LAST`` (1-based, inclusive) as 0-based column indexes."""
    first, _, last = text.partition("-")
    try:
        lo, hi = int(first), int(last or first)
    except ValueError:
        lo = hi = 0
    if not 1 <= lo <= hi:
        raise SystemExit(f"privrec import-items: --category-flags takes FIRST-LAST column numbers (from 1), got {text!r}")
    return tuple(range(lo - 1, hi))


def _header(src: _Input) -> Iterator[list[str]]:
    """The header line's fields (nothing when the file is empty)."""
    with io.TextIOWrapper(src.open_binary(), encoding=src.encoding, newline="") as fh:
        yield from itertools.islice(csv.reader(fh, delimiter=src.delimiter), 1)


def _item_rows(src: _Input, cols: _ItemColumns) -> Iterator[tuple[str, str | None, list[str]]]:
    """(item id, title or None, categories) of every catalogue line, read through ``cols``
    (by default ``item_id[,title[,categories separated by |]]``)."""
    for line_no, row in _csv_lines(src):
        item_id = row[cols.item_id].strip() if len(row) > cols.item_id else ""
        if not item_id or (cols.flags and len(row) < cols.width):
            raise SystemExit(f"{src.path}:{line_no}: expected an item id in column {cols.item_id + 1}"
                             + (f" and {cols.width} columns" if cols.flags else "") + "; nothing more was written")
        title = (row[cols.title].strip() or None) if cols.title is not None and len(row) > cols.title else None
        if title is not None and len(title) > 512:
            raise SystemExit(f"{src.path}:{line_no}: titles have at most 512 characters; nothing more was written")
        categories = ([c.strip() for c in row[cols.categories].split("|") if c.strip()]
                      if cols.categories is not None and len(row) > cols.categories else [])
        yield item_id, title, categories + _flagged(src, line_no, row, cols)


def _flagged(src: _Input, line_no: int, row: list[str], cols: _ItemColumns) -> list[str]:
    """The names of the flag columns that hold 1 on this line (0 or empty: not flagged)."""
    out = []
    for column, name in zip(cols.flags, cols.flag_names, strict=True):
        flag = row[column].strip()
        if flag not in ("0", "1", ""):
            raise SystemExit(f"{src.path}:{line_no}: column {column + 1} ({name}) must be 0 or 1; "
                             "nothing more was written")
        if flag == "1":
            out.append(name)
    return out


def cmd_import_items(args: argparse.Namespace) -> int:
    """Upsert public catalogue items from a CSV (item_id[,title[,categories separated by |]]):
    the only bulk way to create items (ratings and votes imports refuse unknown items)."""
    from app.services import catalog
    from app.services.unit_of_work import after_commit, commit

    src = _Input.of(args)
    cols = _ItemColumns.of(args, src)
    _count_data_lines(src)  # the whole file decodes, before anything is written
    maker = _maker(_settings())
    totals = {"created": 0, "updated": 0}
    rows = _item_rows(src, cols)
    while chunk := list(itertools.islice(rows, args.chunk)):
        with maker() as session:
            out = catalog.import_items(session, dataset=args.dataset, rows=chunk)
            # the serving catalogue is cached per process: only a process that loaded serving has one to drop
            if (serving := sys.modules.get("app.services.serving.active")) is not None:
                after_commit(session, partial(serving.invalidate_catalog, args.dataset))
            commit(session)
        totals = {key: totals[key] + out[key] for key in totals}
    print(json.dumps({"dataset": args.dataset, **totals}))
    return 0


def _vote_rows(src: _Input) -> Iterator[tuple[str, str, int]]:
    """(user, item, vote) rows of a CSV; the vote must read exactly 1, +1 or -1."""
    for line_no, row in _csv_lines(src):
        vote = {"1": 1, "+1": 1, "-1": -1}.get(row[2].strip()) if len(row) >= 3 else None
        if vote is None:
            raise SystemExit(f"{src.path}:{line_no}: expected user,item,vote with vote 1 or -1; nothing more was written")
        yield row[0].strip(), row[1].strip(), vote


def cmd_import_votes(args: argparse.Namespace) -> int:
    """Store votes from a CSV (user,item,vote) through the ingestion path, with a progress bar, all
    or nothing (``--partial``: chunk by chunk): on a data set that randomises at ingestion each
    vote is randomised once on arrival and only the bit is kept."""
    from app.services import votes

    src = _Input.of(args)
    rows = _vote_rows(src)
    chunks = iter(lambda: list(itertools.islice(rows, args.chunk)), [])
    outs = _import_chunks(args, src, "votes", chunks,
                          lambda session, chunk: votes.import_votes(session, dataset=args.dataset, rows=chunk))
    totals = {key: sum(out[key] for out in outs) for key in ("created", "updated", "unchanged")}
    print(json.dumps({"dataset": args.dataset, **totals}))
    return 0


def cmd_import_similarities(args: argparse.Namespace) -> int:
    """Create/update a public similarity source and replace the top-K lists of the items in a CSV
    (item_id,neighbour_id,score), all or nothing."""
    from app.services import public_data
    from app.services.unit_of_work import commit

    src = _Input.of(args)
    _count_data_lines(src)  # the whole file decodes, before anything is written
    lists: dict[str, list[tuple[str, float]]] = {}
    for item, neighbour, score in _rows(src, "item_id,neighbour_id,score"):
        lists.setdefault(item, []).append((neighbour, score))
    with _maker(_settings())() as session:
        source, _ = public_data.put_similarity_source(
            session, dataset=args.dataset, name=args.source, provenance=args.provenance,
            declared_public=args.declare_public, actor=_actor())
        out = public_data.replace_neighbours(session, dataset=args.dataset, source=args.source,
                                             rows=list(lists.items()), max_rows=None)
        commit(session)
    print(json.dumps({"dataset": args.dataset, **out.model_dump(), "provenance": source.provenance}))
    return 0


def cmd_issue_token(args: argparse.Namespace) -> int:
    """Print a signed bearer token."""
    from app.auth import Kind, issue_token

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


def cmd_revoke_token(args: argparse.Namespace) -> int:
    """Revoke a bearer token or dashboard session (the token, ``-`` to read it from stdin, or
    ``--id JTI``) until it expires; every API process refuses it within REVOCATION_REFRESH_S
    seconds. Prints the entry as JSON."""
    from datetime import UTC, datetime

    from app.auth import TokenError, revocation_target
    from app.services import revocations
    from app.services.unit_of_work import commit

    settings = _settings()
    if args.id:
        token_id, expires_at = args.id, int(time.time()) + settings.max_token_ttl_s
    else:
        token = (sys.stdin.readline() if args.token == "-" else args.token or "").strip()
        try:
            token_id, expires_at = revocation_target(token, secret=settings.secret_key, algorithm=settings.jwt_algorithm,
                                                     max_lifetime_s=settings.max_token_ttl_s)
        except TokenError:
            raise SystemExit("privrec revoke-token: not a token this service signed (check SECRET_KEY)") from None
    with _maker(settings)() as session:
        row, created = revocations.revoke(session, token_id=token_id, expires_at=expires_at, actor=_actor(),
                                          reason=args.reason)
        commit(session)
        print(json.dumps({"token_id": token_id, "status": "revoked" if created else "already_revoked",
                          "expires_at": datetime.fromtimestamp(expires_at, UTC).isoformat(),
                          "actor": row.actor}))
    return 0


def cmd_cancel_run(args: argparse.Namespace) -> int:
    """Cancel a queued or running training run as the admin API does and print it as JSON (a
    run that had read private data stays charged)."""
    from app.services import admin
    from app.services.unit_of_work import commit

    with _maker(_settings())() as session:
        run = admin.cancel_training(session, run_id=args.run_id, actor=_actor())
        commit(session)
    print(json.dumps({key: getattr(run, key) for key in ("id", "status", "stage", "cancelled", "refunded",
                                                           "private_data_read", "epsilon_charged")}))
    return 0


def cmd_budget(args: argparse.Namespace) -> int:
    """Print the privacy budget of a data set as JSON."""
    from app.services import admin

    settings = _settings()
    maker = _maker(settings)
    with maker() as session:
        name = args.dataset or settings.default_dataset
        if args.blocks:
            out: Any = admin.blocks_page(session, dataset=name, offset=args.offset, limit=args.limit, settings=settings)
        elif args.forecast:
            out = admin.forecast_view(session, dataset=name, settings=settings)
        else:
            out = admin.budget_view(session, dataset=name)
    print(json.dumps(out.model_dump(mode="json"), indent=2))
    return 0


def cmd_retrain_policy(args: argparse.Namespace) -> int:
    """Print a data set's retrain policy as JSON; with any option (or ``--reset``), set it first."""
    from app.schemas.admin import RetrainPolicyIn
    from app.services import admin
    from app.services.unit_of_work import commit

    settings = _settings()
    name = args.dataset or settings.default_dataset
    values = {"interval_s": args.interval_s, "epsilon": args.epsilon, "min_payable_blocks": args.min_payable_blocks,
              "read_current_block": args.read_current_block}
    with _maker(settings)() as session:
        if args.reset or any(v is not None for v in values.values()):
            current = admin.retrain_policy(session, dataset=name, settings=settings)
            own = {} if args.reset else {k: getattr(current, k) for k in values if k not in current.defaults}
            given = {k: v for k, v in values.items() if v is not None}
            # validated by the service (422 invalid_retrain_policy, a one-line error here)
            body = RetrainPolicyIn.model_construct(**{**dict.fromkeys(values), **own, **given})
            out = admin.set_retrain_policy(session, dataset=name, body=body, settings=settings, actor=_actor())
            commit(session)
        else:
            out = admin.retrain_policy(session, dataset=name, settings=settings)
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
    from app.main import openapi_yaml

    sys.stdout.write(openapi_yaml())
    return 0


def _delimiter(text: str) -> str:
    """One character; ``tab`` or ``\\t`` for a tab."""
    out = {"tab": "\t", "\\t": "\t"}.get(text, text)
    if len(out) != 1:
        raise argparse.ArgumentTypeError("one character (or 'tab')")
    return out


def _encoding(text: str) -> str:
    """A text encoding Python knows (``utf-8``, ``latin-1``, ``cp1252``, ...)."""
    try:
        return codecs.lookup(text).name
    except LookupError:
        raise argparse.ArgumentTypeError(f"unknown encoding {text!r}") from None


def _column(text: str) -> int:
    """A column number, counted from 1 (0: absent)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError("a column number (1 is the first column; 0 means none)")
    return int(text)


def _token_id(text: str) -> str:
    """A token id (``jti``): 1 to 64 characters of letters, digits, ``-`` and ``_``."""
    if not (0 < len(text) <= 64 and all(c.isascii() and (c.isalnum() or c in "-_") for c in text)):
        raise argparse.ArgumentTypeError("1 to 64 letters, digits, '-' or '_'")
    return text


def _reason(text: str) -> str:
    """A short free-text reason (at most 500 characters, no NUL)."""
    if len(text) > 500 or "\x00" in text:
        raise argparse.ArgumentTypeError("at most 500 characters, no NUL")
    return text


def _input_options(s: argparse.ArgumentParser) -> None:
    """How an import command reads its file: delimiter, header line, encoding."""
    s.add_argument("--delimiter", type=_delimiter, default=",", help="field delimiter (default ','; 'tab' for tabs)")
    s.add_argument("--no-header", action="store_true", help="the first line is data, not a header")
    s.add_argument("--encoding", type=_encoding, default="utf-8", help="the file's text encoding (default utf-8)")


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

    s = sub.add_parser("cancel-run", help="cancel a queued or running training run (charged if it had read "
                                          "private data)")
    s.add_argument("run_id", type=int)
    s.set_defaults(func=cmd_cancel_run)

    s = sub.add_parser("migrate", help="apply database migrations")
    s.set_defaults(func=cmd_migrate)

    s = sub.add_parser("import-items", help="upsert public catalogue items from a CSV "
                                            "(item_id[,title[,categories separated by |]])")
    s.add_argument("path")
    s.add_argument("--dataset", default="default")
    _input_options(s)
    s.add_argument("--chunk", type=int, default=10_000, choices=range(1, 100_001), metavar="1..100000")
    s.add_argument("--id-column", type=_column, default=1, metavar="N", help="column of the item id (default 1)")
    s.add_argument("--title-column", type=_column, default=2, metavar="N",
                   help="column of the title (default 2; 0: no title)")
    s.add_argument("--categories-column", type=_column, metavar="N",
                   help="column of categories separated by | (default 3, or 0 with --category-flags; 0: none)")
    s.add_argument("--category-flags", metavar="FIRST-LAST",
                   help="columns holding 0/1 flags, one category each (MovieLens genres)")
    s.add_argument("--category-names", metavar="NAME,...",
                   help="the categories of the --category-flags columns, in order (default: the header's names)")
    s.set_defaults(func=cmd_import_items)

    s = sub.add_parser("import-csv", help="upsert ratings from a CSV file (.csv or .csv.gz); every item must "
                                          "already be in the catalogue (import-items)")
    s.add_argument("path")
    s.add_argument("--dataset", default="default")
    _input_options(s)
    s.add_argument("--chunk", type=int, default=10_000)
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--partial", action="store_true", help="commit chunk by chunk (default: all or nothing); "
                   "a failure then says how many rows were kept")
    s.set_defaults(func=cmd_import_csv)

    s = sub.add_parser("import-votes", help="store thumbs up/down votes from a CSV (user,item,vote with vote "
                       "1 or -1), randomised on arrival where the data set says so; all or nothing")
    s.add_argument("path")
    s.add_argument("--dataset", default="default")
    _input_options(s)
    s.add_argument("--chunk", type=int, default=10_000, choices=range(1, 10_001), metavar="1..10000")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--partial", action="store_true", help="commit chunk by chunk (default: all or nothing); "
                   "a failure then says how many rows were kept")
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
    _input_options(s)
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

    s = sub.add_parser("revoke-token", help="revoke a bearer token or dashboard session before it expires")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("token", nargs="?", help="the token ('-': read it from stdin)")
    g.add_argument("--id", type=_token_id, help="only the token's id (its jti claim)")
    s.add_argument("--reason", type=_reason, help="why (kept with the entry; at most 500 characters)")
    s.set_defaults(func=cmd_revoke_token)

    s = sub.add_parser("budget", help="print a data set's privacy budget (or, with --blocks, its privacy blocks)")
    s.add_argument("--dataset")
    s.add_argument("--blocks", action="store_true", help="list the privacy blocks, current period first (paged), "
                   "each with its retirement forecast at the retrain policy")
    s.add_argument("--forecast", action="store_true", help="when the blocks retire at the retrain policy, and the "
                   "warnings ahead")
    s.add_argument("--offset", type=int, default=0)
    s.add_argument("--limit", type=int, default=100)
    s.set_defaults(func=cmd_budget)

    s = sub.add_parser("retrain-policy", help="print a data set's retrain policy; with an option, change that "
                       "field (the others are kept); --reset: every field back to the deployment's setting")
    s.add_argument("--dataset")
    s.add_argument("--interval-s", type=int, help="seconds between scheduled runs")
    s.add_argument("--epsilon", type=float, help="each scheduled run's epsilon")
    s.add_argument("--min-payable-blocks", type=int, help="payable blocks worth training on (warned below)")
    s.add_argument("--read-current-block", action=argparse.BooleanOptionalAction, default=None,
                   help="whether scheduled runs read the still-open current block")
    s.add_argument("--reset", action="store_true", help="start from the deployment's settings")
    s.set_defaults(func=cmd_retrain_policy)

    s = sub.add_parser("ledger", help="privacy ledger tools")
    ledger_sub = s.add_subparsers(dest="ledger_command", required=True)
    s = ledger_sub.add_parser("verify", help="replay the ledgers: hash chains, spends and composed states")
    s.add_argument("--dataset", help="only this data set (and its person budget)")
    s.set_defaults(func=cmd_ledger_verify)

    s = sub.add_parser("openapi", help="print the OpenAPI document as YAML")
    s.set_defaults(func=cmd_openapi)

    s = sub.add_parser("healthcheck", help="exit 0 when this container's role (api, worker, beat) is healthy")
    s.add_argument("role", nargs="?", choices=ROLES, help="default: the role PID 1 runs (tini -- privrec ROLE)")
    s.set_defaults(func=cmd_healthcheck)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Expected failures end in one line on stderr (exit 1), never a traceback; a
    reader that closes the pipe early (``privrec budget | head``) ends the command quietly."""
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt:
        print(f"privrec {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        message = _expected_failure(exc)
        if message is None:
            raise
        raise SystemExit(f"privrec {args.command}: {message}") from None


def _reader_gone() -> int:
    """Point stdout at /dev/null so the interpreter's last flush meets no closed pipe; the exit
    status is the one a shell reports for a writer whose reader went away (128 + SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


def _expected_failure(exc: Exception) -> str | None:
    """One line for a failure the operator can fix (bad input, configuration, an unreachable
    database, an unreadable file); None for anything else. Library exception types are looked up
    only when their library was loaded: a command that never imported it cannot have raised them."""
    if isinstance(exc, PrivrecError):
        return exc.message + (f" {json.dumps(exc.details, default=str)[:2000]}" if exc.details else "")
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(exc, pydantic.ValidationError):
        # settings: one line, never the rejected value (e.g. a secret)
        return f"configuration error: {_config_errors(exc)}"
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is not None and isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError)):
        cause = type(exc.orig).__name__ if exc.orig is not None else type(exc).__name__
        return f"the database (DATABASE_URL) is unreachable or missing ({cause})"
    if isinstance(exc, OSError):
        return f"{exc.filename}: {exc.strerror}" if exc.filename else (exc.strerror or type(exc).__name__)
    return None


def _config_errors(exc: Any) -> str:
    """Every settings error as ``FIELD: message``, without the input values."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        field = ".".join(str(x) for x in err.get("loc", ())).upper()
        parts.append(f"{field}: {err['msg']}" if field else err["msg"])
    return "; ".join(parts)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
