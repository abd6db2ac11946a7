"""Single-statement PostgreSQL reads on the event loop: the serving hot path's round trip without
a worker thread.

A read that runs in a worker thread costs the thread hop and, under load, the interpreter lock
passed back and forth between the event loop and the threads (measured in `serve`: a fifth of a
recommendation's server CPU). Here the statement runs on psycopg's asynchronous connection, so
the event loop keeps the interpreter while PostgreSQL works and the request never leaves it.

Each event loop gets its own small pool per database (asyncio objects belong to one loop; a test
client runs each app on its own loop). Connections are autocommit (one statement is one snapshot,
no BEGIN/ROLLBACK round trips) with a binary-result cursor kept per connection. A connection
whose statement fails or is cancelled is closed rather than reused (its state is unknown); a
dead one also closes the idle ones (as SQLAlchemy empties its pool) and is reported as
``connection_invalidated``, so the caller's one retry connects afresh.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

__all__ = ["AsyncReadPool", "pool_for", "close_pools"]


class AsyncReadPool:
    """At most ``size`` autocommit connections of one database, used by one event loop."""

    def __init__(self, connect_kwargs: dict[str, Any], size: int) -> None:
        self._kwargs = connect_kwargs
        self._idle: deque[tuple[psycopg.AsyncConnection[Any], psycopg.AsyncCursor[Any]]] = deque()
        self._slots = asyncio.Semaphore(size)

    async def rows(self, sql: str, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
        """All rows of one statement (driver errors re-raised as SQLAlchemy's ``DBAPIError``)."""
        async with self._slots:
            conn, cursor = self._idle.pop() if self._idle else await self._connect(sql, params)
            try:
                await cursor.execute(sql, params)
                rows = await cursor.fetchall()
            except BaseException as exc:
                dead = conn.closed or conn.broken
                await conn.close()
                if dead:  # the server went away: the idle ones are likely dead too
                    await self.close()
                if isinstance(exc, psycopg.Error):
                    raise DBAPIError.instance(sql, params, exc, psycopg.Error, connection_invalidated=dead) from exc
                raise
            self._idle.append((conn, cursor))
            return rows

    async def _connect(self, sql: str, params: Mapping[str, Any]) -> tuple[Any, Any]:
        try:
            conn = await psycopg.AsyncConnection.connect(autocommit=True, **self._kwargs)
        except psycopg.Error as exc:
            raise DBAPIError.instance(sql, params, exc, psycopg.Error) from exc
        return conn, conn.cursor(binary=True)

    async def close(self) -> None:
        """Close the idle connections (those in use close when their statement fails)."""
        while self._idle:
            conn, _ = self._idle.pop()
            await conn.close()


_pools: dict[tuple[int, str], tuple[asyncio.AbstractEventLoop, AsyncReadPool]] = {}


def pool_for(engine: Engine, size: int) -> AsyncReadPool:
    """The running loop's pool for ``engine``'s PostgreSQL database (created on first use; pools
    of loops that have closed are forgotten)."""
    loop = asyncio.get_running_loop()
    key = (id(loop), engine.url.render_as_string(hide_password=False))
    entry = _pools.get(key)
    if entry is None or entry[0] is not loop:
        for stale in [k for k, (other, _) in _pools.items() if other.is_closed()]:
            del _pools[stale]
        _, kwargs = engine.dialect.create_connect_args(engine.url)
        kwargs = {k: v for k, v in kwargs.items() if k != "context"}  # the sync engine's adapters
        entry = _pools[key] = (loop, AsyncReadPool(kwargs, size))
    return entry[1]


async def close_pools() -> None:
    """Close the running loop's idle pooled connections (app shutdown)."""
    loop = asyncio.get_running_loop()
    for key, (owner, pool) in list(_pools.items()):
        if owner is loop:
            del _pools[key]
            await pool.close()
