"""The numeric core imports neither the web framework, the database layer nor the task queue."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import app.core

FORBIDDEN = ("fastapi", "sqlalchemy", "pydantic", "celery", "starlette", "alembic", "redis")


def test_core_imports_no_service_framework():
    modules = [m.name for m in pkgutil.walk_packages(app.core.__path__, prefix="app.core.")]
    assert "app.core.mf.dpals" in modules and "app.core.privacy.accounting" in modules
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + (
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\nprint(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"app.core pulls in {out.stdout.strip()}"
