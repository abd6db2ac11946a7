"""Dask is an optional extra (issue 28): the CLI, the API and the training runner never load it."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_the_app_and_the_runner_import_without_dask():
    code = ("import sys\nimport app.cli, app.main, app.services.training.runner, app.core.mf.distributed\n"
            "print(','.join(m for m in ('dask', 'distributed', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
