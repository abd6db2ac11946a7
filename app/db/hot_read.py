"""One statement, one database round trip: the serving hot path's read (:mod:`app.db.stores.serving`).

A pooled session costs a pre-ping, a BEGIN and a ROLLBACK around every query (four round trips
for one SELECT). A single SELECT is its own snapshot, so on PostgreSQL the hot path runs it on
an autocommit engine beside the session's (:func:`app.db.session.get_read_engine`); other
databases (the embedded SQLite) use the session itself.

On PostgreSQL the statement is compiled once to the driver's SQL and run on a binary-result
driver cursor kept with the pooled connection: SQLAlchemy's per-execution machinery
(compiled-cache lookup, execution context, result wrapping) cost about as much CPU as the query
itself. Driver errors
are re-raised as SQLAlchemy's (``OperationalError`` stays a 503), with a dead connection
invalidated so the one retry gets a fresh one.

:func:`read_rows_async` is the same read on the event loop (:mod:`app.db.async_read`): no
worker thread, for a request whose other work is all in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, Executable
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app.db.async_read import pool_for
from app.db.session import get_read_engine

__all__ = ["Rows", "read_rows", "read_rows_async", "open_groups", "MAX_GROUPS", "GROUP_IN_FLIGHT", "GROUP_SECOND_AFTER_S"]


Rows = Sequence[Sequence[Any]]  # SQLAlchemy rows or the driver's tuples: indexed by position


def read_rows(session: Session, statement: Executable, params: Mapping[str, Any]) -> Rows:
    """All rows of ``statement`` in one round trip (retried once on a dead pooled connection)."""
    bind = session.get_bind()
    if bind.dialect.name != "postgresql" or not isinstance(bind, Engine):  # a session bound to one connection reads on it
        return session.execute(statement, params).all()
    engine = get_read_engine(bind)
    try:
        return _rows(engine, statement, params)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        return _rows(engine, statement, params)  # the pool dropped the dead connection


async def read_rows_async(bind: Any, statement: Executable, params: Mapping[str, Any], key: str,
                          pool_size: int) -> Rows | None:
    """:func:`read_rows` for one ``key`` on the running event loop, for a PostgreSQL engine
    ``bind``; None for any other bind (the caller reads in a thread).

    ``statement`` takes the array parameter ``keys`` besides ``params`` and its first column is
    the key of each row. Concurrent reads with the same ``params`` are grouped (a
    :class:`_Group` per loop, database, statement and ``params``): while a statement is in flight,
    the keys that arrive wait and go together in the next one, so under load one round trip (one
    wake-up of PostgreSQL, one statement to parse and plan) serves several requests. Each key's
    statement starts after its request arrived, so it sees every write committed before that.
    The rows come back without the key column, in the statement's order.
    """
    if not isinstance(bind, Engine) or bind.dialect.name != "postgresql":
        return None
    loop = asyncio.get_running_loop()
    name = (id(loop), bind.url.render_as_string(hide_password=False), id(statement), tuple(sorted(params.items())))
    group = _groups.get(name)
    if group is None or group.loop is not loop:
        _forget_idle_groups()
        group = _groups[name] = _Group(loop, bind, statement, dict(params), pool_size)
    return await group.read(key)


# Statements of one group in flight at a time: one, and a second only once the first has been
# out for GROUP_SECOND_AFTER_S with reads waiting, so a statement held up (PostgreSQL's backend
# waiting for a core) does not stall every request of the process for longer than that. Two
# from the start carried 4-5 users a statement under a closed loop of 32 clients and cost about
# twice the PostgreSQL CPU per request (0.12 against 0.06 ms) and 5 % more of the API's.
GROUP_IN_FLIGHT = 2
GROUP_SECOND_AFTER_S = 0.005
GROUP_MAX_KEYS = 64  # keys per statement


class _Group:
    """The grouped reads of one statement with fixed ``params`` on one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, engine: Engine, statement: Executable,
                 params: dict[str, Any], pool_size: int) -> None:
        self.loop = loop
        self._engine, self._sql, self._params, self._pool_size = engine, _driver_sql(engine, statement), params, pool_size
        self._waiting: list[tuple[str, asyncio.Future[Rows]]] = []
        self._in_flight = 0
        self._second: asyncio.TimerHandle | None = None  # opens the second slot (GROUP_SECOND_AFTER_S)
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references

    @property
    def idle(self) -> bool:
        """No statement in flight and no read waiting."""
        return self._in_flight == 0 and not self._waiting

    async def read(self, key: str) -> Rows:
        future: asyncio.Future[Rows] = self.loop.create_future()
        self._waiting.append((key, future))
        self._schedule()
        return await future

    def _schedule(self) -> None:
        """With reads waiting: send them now when nothing is in flight, else open the second slot
        after GROUP_SECOND_AFTER_S (unless its timer runs already or both slots are taken)."""
        if not self._waiting:
            return
        if self._in_flight == 0:
            self._send()
        if self._waiting and self._second is None and self._in_flight < GROUP_IN_FLIGHT:
            self._second = self.loop.call_later(GROUP_SECOND_AFTER_S, self._send_waiting)

    def _send_waiting(self) -> None:
        """The second slot's timer: send what still waits (a statement that came back meanwhile
        may have taken it) if a slot is free."""
        self._second = None
        if self._waiting and self._in_flight < GROUP_IN_FLIGHT:
            self._send()

    def _send(self) -> None:
        batch, self._waiting = self._waiting[:GROUP_MAX_KEYS], self._waiting[GROUP_MAX_KEYS:]
        if not self._waiting and self._second is not None:
            self._second.cancel()
            self._second = None
        self._in_flight += 1
        task = self.loop.create_task(self._run(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[str, asyncio.Future[Rows]]]) -> None:
        try:
            rows = await self._rows(sorted({key for key, _ in batch}))
        except BaseException as exc:  # every waiting request fails as its own read would
            for _, future in batch:
                if not future.done():
                    if isinstance(exc, Exception):
                        future.set_exception(exc)
                    else:
                        future.cancel()  # the statement itself was cancelled (loop shutdown)
            if not isinstance(exc, Exception):
                raise
        else:
            by_key: dict[str, list[Sequence[Any]]] = {key: [] for key, _ in batch}
            for row in rows:
                by_key[row[0]].append(row[1:])
            for key, future in batch:
                if not future.done():
                    future.set_result(by_key[key])
        finally:
            self._in_flight -= 1
            self._schedule()

    async def _rows(self, keys: list[str]) -> Rows:
        params = {**self._params, "keys": keys}
        try:
            return await pool_for(self._engine, self._pool_size).rows(self._sql, params)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            return await pool_for(self._engine, self._pool_size).rows(self._sql, params)  # a fresh connection


_groups: dict[tuple[Any, ...], _Group] = {}
MAX_GROUPS = 256  # requests name the data set: idle groups beyond this are forgotten


def open_groups() -> int:
    """How many groups this process keeps (bounded by :data:`MAX_GROUPS` plus those in use)."""
    return len(_groups)


def _forget_idle_groups() -> None:
    """Drop the groups of closed loops and, past ``MAX_GROUPS``, every idle group."""
    for name, group in list(_groups.items()):
        if group.loop.is_closed() or (len(_groups) >= MAX_GROUPS and group.idle):
            del _groups[name]


def _rows(engine: Engine, statement: Executable, params: Mapping[str, Any]) -> Rows:
    sql = _driver_sql(engine, statement)
    dbapi_error = engine.dialect.loaded_dbapi.Error
    pooled = engine.raw_connection()  # the pool's checkout without a Connection around it
    try:
        try:
            return _cursor(pooled).execute(sql, params).fetchall()
        except dbapi_error as exc:
            dead = bool(getattr(pooled.driver_connection, "closed", False))
            if dead:
                pooled.invalidate()
            raise DBAPIError.instance(sql, params, exc, dbapi_error, connection_invalidated=dead) from exc
    finally:
        pooled.close()


_CURSOR = "privrec_hot_read_cursor"


def _cursor(pooled: Any) -> Any:
    """The pooled connection's own binary-result cursor, kept in the pool record's ``info`` (which
    goes with the connection when the pool drops it): no cursor and adapters map to build per
    read, and no text parsing of the numbers."""
    cursor = pooled.info.get(_CURSOR)
    if cursor is None:
        cursor = pooled.info[_CURSOR] = pooled.driver_connection.cursor(binary=True)
    return cursor


_compiled: dict[tuple[int, str], tuple[Executable, str]] = {}  # the statement is kept: its id stays its own


def _driver_sql(engine: Engine, statement: Executable) -> str:
    """``statement`` as the driver's SQL (named parameters in its style), compiled once."""
    key = (id(statement), engine.dialect.name)
    entry = _compiled.get(key)
    if entry is None or entry[0] is not statement:
        entry = _compiled[key] = (statement, str(statement.compile(dialect=engine.dialect)))  # type: ignore[attr-defined]  # a ClauseElement
    return entry[1]
