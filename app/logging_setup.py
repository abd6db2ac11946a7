"""One log format for every process (API, Celery worker, Celery beat): structlog renders each
standard-library record as one JSON object per line with a UTC timestamp, the level, the logger,
the message, the request id and the allowed structured extras.

What the processes never log: no raw id from a path or a body (it names a rater), no training
duration (it grows with the private data), no exception message (a driver's message can carry SQL
parameters). Lines name the route template and the request id instead.

* API processes (``privrec serve`` / ``privrec api``): uvicorn's own access log, which writes the
  raw path, is off and uvicorn's logging config is this format (:func:`uvicorn_log_options`);
  :mod:`app.api.middleware` writes one access line per request with the route template and
  binds the request id (:data:`REQUEST_ID`).
* Training requests: the request id travels with the Celery task as the message header
  :data:`REQUEST_ID_HEADER`; the worker binds it while the task runs, so one id follows a
  training from the API request into the worker's lines.
* Celery workers: the task tracer's "Task … succeeded in Xs: <return value>" becomes "Task …
  succeeded"; failures name the exception's type, not its message or traceback text.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import traceback
from collections.abc import Mapping
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from app.config import Settings

__all__ = ["REQUEST_ID", "REQUEST_ID_HEADER", "current_request_id", "request_id_headers", "request_id_from_headers",
           "JsonFormatter", "TextFormatter", "service_handler", "configure_logging", "uvicorn_log_options", "TaskLogRedaction",
           "redact_task_logs"]

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
"""The id of the request (or of the task's originating request) being served; every log line
written while it is set carries it."""

REQUEST_ID_HEADER = "privrec_request_id"
"""The Celery message header carrying the originating API request's id into a task."""

_ALLOWED_EXTRAS = ("http",)
"""Structured extras (logging's ``extra=``) that reach the output; every other attribute a
library attaches to a record (e.g. Celery's ``data`` with task arguments) is dropped."""


def current_request_id() -> str | None:
    """The id bound to the current context (None outside a request or a task it started)."""
    return REQUEST_ID.get()


def request_id_headers() -> dict[str, str]:
    """Message headers carrying the current request id to a task (empty outside a request)."""
    rid = REQUEST_ID.get()
    return {REQUEST_ID_HEADER: rid} if rid else {}


def request_id_from_headers(headers: Mapping[str, Any] | None) -> str | None:
    """The request id a task's message headers carry (None when absent or not a string)."""
    rid = (headers or {}).get(REQUEST_ID_HEADER)
    return rid if isinstance(rid, str) and rid else None


# ----------------------------------------------------------------------------- processors
def _add_request_id(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    rid = REQUEST_ID.get()
    if rid:
        event["request_id"] = rid
    return event


def _exception_summary(with_stack: bool) -> Processor:
    """A processor replacing a record's exception by its type (and, in text form, the code
    locations of its frames): never the message, which can carry data."""

    def summarise(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
        exc = event.pop("exc_info", None)
        event.pop("exception", None)
        if exc is True:
            exc = sys.exc_info()
        if isinstance(exc, BaseException):
            exc = (type(exc), exc, exc.__traceback__)
        if isinstance(exc, tuple) and exc and exc[0] is not None:
            event["exc_type"] = exc[0].__name__
            if with_stack and exc[2] is not None:
                event["exc_stack"] = [f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_tb(exc[2])]
        return event

    return summarise


def _processors(renderer: Processor, *, with_stack: bool) -> list[Processor]:
    """The chain every record goes through, ending in ``renderer``."""
    return [
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.EventRenamer("msg"),
        _add_request_id,
        structlog.stdlib.ExtraAdder(allow=_ALLOWED_EXTRAS),
        _exception_summary(with_stack),
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
        renderer,
    ]


class JsonFormatter(structlog.stdlib.ProcessorFormatter):
    """The service's log format: one JSON object per line, ``ts`` in UTC (ISO 8601, ``Z``),
    ``level``, ``logger``, ``msg``, ``request_id`` when bound, ``http`` for access lines and
    ``exc_type`` for an exception (its type only)."""

    def __init__(self) -> None:
        super().__init__(processors=_processors(structlog.processors.JSONRenderer(ensure_ascii=False),
                                                with_stack=False))


class TextFormatter(structlog.stdlib.ProcessorFormatter):
    """The same fields as :class:`JsonFormatter` on one human-readable line (``LOG_FORMAT=text``);
    an exception adds the code locations of its frames, never its message."""

    def __init__(self) -> None:
        super().__init__(processors=_processors(structlog.dev.ConsoleRenderer(colors=False, timestamp_key="ts",
                                                                              event_key="msg"), with_stack=True))


class _ServiceHandler(logging.StreamHandler):
    """The handler :func:`configure_logging` installs (found and replaced when called again)."""


def service_handler(fmt: str = "json", stream: TextIO | None = None) -> logging.Handler:
    """The one handler of a process: ``stream`` (stderr) in :class:`JsonFormatter`'s format (or
    :class:`TextFormatter`'s for ``fmt="text"``); a factory for ``logging.config.dictConfig``."""
    handler = _ServiceHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    return handler


_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error")
"""uvicorn's loggers that carry handlers of their own under its default config."""
_SERVICE_LOGGERS = ("privrec", "app", "workers", "celery", *_UVICORN_LOGGERS)
"""Loggers at the configured level; every other library logs warnings and errors only (their
informational lines can carry raw URLs and are noise)."""


def _numeric(level: str | int) -> int:
    """A level name or number as a number (ValueError for an unknown name)."""
    value = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(value, int):
        raise ValueError(f"unknown log level {level!r}")
    return value


def configure_logging(level: str | int = "INFO", fmt: Literal["json", "text"] | str = "json",
                      stream: TextIO | None = None) -> None:
    """Send every log record of this process (the service's, uvicorn's, Celery's, libraries')
    through one handler on the root logger (:func:`service_handler`). Idempotent: a second call
    replaces the handler; Python warnings become log records too."""
    numeric = _numeric(level)
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _ServiceHandler)] + [service_handler(fmt, stream)]
    root.setLevel(max(numeric, logging.WARNING))
    for name in _SERVICE_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [] if name in _UVICORN_LOGGERS else [
            h for h in logger.handlers if not isinstance(h, _ServiceHandler)]
        logger.setLevel(numeric)
        logger.propagate = True
    logging.captureWarnings(True)


def uvicorn_log_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's logging options for an API process (the supervisor and every server process):
    its level, no access log (raw paths), and a logging config that is the service's one
    handler on the root logger (uvicorn's own formatters print exception messages)."""
    level = _numeric(settings.log_level)
    return {"log_level": settings.log_level.lower(), "access_log": False, "log_config": {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"service": {"()": f"{__name__}.service_handler", "fmt": settings.log_format}},
        "root": {"handlers": ["service"], "level": max(level, logging.WARNING)},
        "loggers": {name: {"handlers": [], "propagate": True, "level": level} for name in _UVICORN_LOGGERS},
    }}


# ----------------------------------------------------------------------------- Celery's tracer
_TRACE_LOGGER = "celery.app.trace"


class TaskLogRedaction(logging.Filter):
    """Rewrites the Celery tracer's per-task lines: no runtime, no return value, no arguments, and
    an exception named by its type only."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = record.args if isinstance(record.args, dict) else None
        if context is None or "id" not in context or "name" not in context:
            return True
        safe = {"name": context["name"], "id": context["id"]}
        if "runtime" in context:
            record.msg = "Task %(name)s[%(id)s] succeeded"
        elif "exc" in context:
            safe["description"] = str(context.get("description", "failed"))
            safe["exc_type"] = str(context["exc"]).split("(", 1)[0].split(":", 1)[0][:64]
            record.msg = "Task %(name)s[%(id)s] %(description)s: %(exc_type)s"
            record.exc_info, record.exc_text = None, None
        else:
            return True
        record.args = safe
        if hasattr(record, "data"):
            record.data = safe
        return True


def redact_task_logs() -> None:
    """Install :class:`TaskLogRedaction` on the Celery tracer's logger (idempotent)."""
    logger = logging.getLogger(_TRACE_LOGGER)
    if not any(isinstance(f, TaskLogRedaction) for f in logger.filters):
        logger.addFilter(TaskLogRedaction())
