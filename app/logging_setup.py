"""What the processes log, and what they never log: no raw id from a path or a body (it names a
rater), no training duration (it grows with the private data), no exception message (a driver's
message can carry SQL parameters). Lines name the route template and the request id instead.

* API processes (``privrec serve`` / ``privrec api``): uvicorn's own access log, which writes the
  raw path, is off and uvicorn does not install its logging config (the app's JSON logs cover
  ``uvicorn.error``); :mod:`app.api.middleware` writes one access line per request with the
  route template.
* Celery workers: the task tracer's "Task … succeeded in Xs: <return value>" becomes "Task …
  succeeded"; failures name the exception's type, not its message or traceback text.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from app.config import Settings

__all__ = ["uvicorn_log_options", "TaskLogRedaction", "redact_task_logs", "TypeOnlyFormatter"]


def uvicorn_log_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's logging options for an API process: its level, no access log (raw paths), no
    logging config of its own (its default formatter prints exception messages)."""
    return {"log_level": settings.log_level.lower(), "access_log": False, "log_config": None}


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


class TypeOnlyFormatter(logging.Formatter):
    """The plain-text log format: an exception is named by its type and stack, never its message."""

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        exc_type = ei[0].__name__ if ei and ei[0] is not None else "Exception"
        return "".join(traceback.format_tb(ei[2])) + exc_type if ei and ei[2] is not None else exc_type
