"""The CLI as an operator meets it: start-up without the heavy libraries, MovieLens's catalogue
through ``--encoding`` and the column mapping (the README's recipe, verbatim), a closed pipe, one-line
errors and the actor's name."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from app import cli
from app.config import get_settings, reset_settings_cache
from app.db.session import dispose_engines
from tests.conftest import require_data

SECRET = "cli-tests-secret-0123456789abcdef-xyz"
ROOT = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).with_name("privrec"))
HEAVY = ("fastapi", "sqlalchemy", "scipy", "dp_accounting", "alembic", "uvicorn", "numpy", "celery")

GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western"]


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("SECRET_KEY", SECRET)
    monkeypatch.delenv("REDIS_URL", raising=False)
    reset_settings_cache()
    yield tmp_path
    dispose_engines()
    reset_settings_cache()


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    return {**env, "DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}", "SECRET_KEY": SECRET}


# ---------------------------------------------------------------------------- start-up
_LOADED = """
import json, sys
from app.cli import main
try:
    main(sys.argv[2:])
except SystemExit:
    pass
with open(sys.argv[1], "w") as fh:
    json.dump(sorted(sys.modules), fh)
"""


@pytest.mark.parametrize("argv", [["--help"], ["issue-token", "--admin"], ["issue-token", "--user", "u1"],
                                  ["import-items", "--help"]])
def test_light_commands_load_no_web_database_or_numeric_library(tmp_path: Path, argv: list[str]) -> None:
    """``privrec --help`` and ``privrec issue-token`` import neither the web app nor SQLAlchemy,
    Alembic, SciPy or the accountant: the commands import what they use when they run."""
    out = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", _LOADED, str(out), *argv], env=_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    loaded = {m.split(".")[0] for m in json.loads(out.read_text())}
    assert "app" in loaded and loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


@pytest.mark.parametrize("command", ["import-items", "import-csv"])
def test_imports_load_no_web_app_migrations_or_accountant(cli_env: Path, command: str) -> None:
    """The catalogue and ratings imports need the database, not the web app, Alembic or the accountant."""
    assert cli.main(["migrate"]) == 0
    (cli_env / "items.csv").write_text("item_id\na\n")
    assert cli.main(["import-items", str(cli_env / "items.csv")]) == 0
    (cli_env / "in.csv").write_text("item_id\na\n" if command == "import-items" else "u,i,r\nx,a,3\n")
    out = cli_env / "modules.json"
    argv = [command, "in.csv", *(["--quiet"] if command == "import-csv" else [])]
    done = subprocess.run([sys.executable, "-c", _LOADED, str(out), *argv], env=_env(cli_env), cwd=cli_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    loaded = {m.split(".")[0] for m in json.loads(out.read_text())}
    assert "sqlalchemy" in loaded and loaded.isdisjoint({"fastapi", "alembic", "scipy", "dp_accounting", "uvicorn"})


# ---------------------------------------------------------------------------- MovieLens catalogue
def _readme_recipe(command: str) -> list[str]:
    """The README's MovieLens recipe line for ``privrec COMMAND ml-100k/...``, as argv (without 'privrec')."""
    lines = [line for line in (ROOT / "README.md").read_text().splitlines()
             if re.match(rf"privrec {command} ml-100k/", line)]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[1:]


def _write_latin1_u_item(folder: Path) -> list[tuple[str, str, list[str]]]:
    """A small catalogue in ML-100K's ``u.item`` layout (latin-1, ``|``, 5 fields then 19 genre flags)."""
    items = [("1", "Toy Story (1995)", ["Animation", "Children's", "Comedy"]),
             ("2", "Misérables, Les (1995)", ["Drama", "War"]),
             ("3", "Città delle donne, La (1980)", []),
             ("4", "Señorita Extraviada (2001)", ["unknown"])]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "u.item", "w", encoding="latin-1", newline="") as fh:
        for item_id, title, genres in items:
            flags = "|".join("1" if g in genres else "0" for g in GENRES)
            fh.write(f"{item_id}|{title}|01-Jan-1995||http://us.imdb.com/M/title-exact?x|{flags}\n")
    return items


def _catalogue() -> dict[str, tuple[str | None, list[str]]]:
    from sqlalchemy import text

    from app.db.session import session_scope

    with session_scope(get_settings().database_url) as s:
        rows = s.execute(text("SELECT external_id, title, categories FROM items")).all()
    return {r[0]: (r[1], list(json.loads(r[2]) if isinstance(r[2], str) else r[2] or [])) for r in rows}


def test_readme_movielens_recipe_imports_a_latin1_catalogue_and_its_ratings(cli_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["migrate"]) == 0
    items = _write_latin1_u_item(cli_env / "ml-100k")
    monkeypatch.chdir(cli_env)
    capsys.readouterr()
    assert cli.main(_readme_recipe("import-items")) == 0
    assert json.loads(capsys.readouterr().out) == {"dataset": "default", "created": 4, "updated": 0}
    assert _catalogue() == {item_id: (title, genres) for item_id, title, genres in items}
    # the ratings: tab-separated user, item, rating, timestamp, no header
    (cli_env / "ml-100k" / "u.data").write_text("".join(f"{u}\t{i}\t{1 + (u + i) % 5}\t881250949\n"
                                                        for u in range(1, 6) for i in range(1, 5)))
    assert cli.main(_readme_recipe("import-csv")) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {"dataset": "default", "rows": 20}


def test_a_wrong_encoding_is_one_line_naming_the_option_and_writes_nothing(cli_env: Path) -> None:
    assert cli.main(["migrate"]) == 0
    _write_latin1_u_item(cli_env / "ml-100k")
    argv = [a for a in _readme_recipe("import-items") if a not in ("--encoding", "latin-1")]
    done = subprocess.run([EXE, *argv], env=_env(cli_env), cwd=cli_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "ml-100k/u.item:2: not utf-8 text; nothing was written (name the file's encoding with --encoding, "
        "e.g. --encoding latin-1)"]
    assert _catalogue() == {}


def test_category_flags_take_their_names_from_the_header(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["migrate"]) == 0
    (cli_env / "items.tsv").write_text("title\tid\tcomedy\tdrama\nA\ta1\t1\t0\nB\tb2\t1\t1\n")
    args = ["import-items", str(cli_env / "items.tsv"), "--delimiter", "tab", "--id-column", "2", "--title-column", "1"]
    assert cli.main([*args, "--category-flags", "3-4"]) == 0
    assert _catalogue() == {"a1": ("A", ["comedy"]), "b2": ("B", ["comedy", "drama"])}
    for bad, message in ((["--category-flags", "3-4", "--category-names", "one"], "give a non-empty name"),
                         (["--category-names", "x"], "needs --category-flags"),
                         (["--category-flags", "4-3"], "FIRST-LAST"),
                         (["--category-flags", "2-2"], "must be 0 or 1")):
        with pytest.raises(SystemExit, match=message):
            cli.main([*args, *bad])


@pytest.mark.data
def test_readme_movielens_recipe_on_the_real_u_item(cli_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The recipe verbatim on ML-100K's own ``u.item`` (latin-1; skipped when absent outside CI)."""
    folder = require_data("ml-100k", "u.item").parent
    assert cli.main(["migrate"]) == 0
    monkeypatch.chdir(folder.parent)
    capsys.readouterr()
    assert cli.main(_readme_recipe("import-items")) == 0
    assert json.loads(capsys.readouterr().out)["created"] == 1682
    catalogue = _catalogue()
    assert catalogue["1"] == ("Toy Story (1995)", ["Animation", "Children's", "Comedy"])
    assert any("é" in (title or "") for title, _ in catalogue.values())


# ---------------------------------------------------------------------------- pipes, errors, actor
@pytest.mark.parametrize("argv", [["openapi"], ["budget"]])
def test_a_closed_pipe_ends_the_command_quietly(cli_env: Path, argv: list[str]) -> None:
    """``privrec budget | head`` where the reader has gone: no traceback, the pipe's exit status."""
    assert cli.main(["migrate"]) == 0
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the command writes
    try:
        done = subprocess.run([EXE, *argv], env=_env(cli_env), cwd=cli_env, stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == ""


@pytest.mark.parametrize("argv, message", [
    (["import-items", "."], "no such file: ."),
    (["import-csv", "missing.csv"], "no such file: missing.csv"),
    (["budget", "--dataset", "nope"], "privrec budget: "),
])
def test_expected_failures_are_one_line(cli_env: Path, argv: list[str], message: str) -> None:
    assert cli.main(["migrate"]) == 0
    done = subprocess.run([EXE, *argv], env=_env(cli_env), cwd=cli_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr


def test_bad_options_are_refused_before_anything_runs(tmp_path: Path) -> None:
    for argv, message in ((["import-items", "x.csv", "--encoding", "klingon"], "unknown encoding 'klingon'"),
                          (["import-csv", "x.csv", "--delimiter", "ab"], "one character"),
                          (["import-items", "x.csv", "--id-column", "-1"], "a column number")):
        done = subprocess.run([EXE, *argv], env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_the_actor_is_the_login_name_without_user_in_the_environment(cli_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from sqlalchemy import text

    from app.db.session import session_scope

    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["migrate"]) == 0
    (cli_env / "items.csv").write_text("item_id\n" + "".join(f"i{i}\n" for i in range(12)))
    assert cli.main(["import-items", str(cli_env / "items.csv")]) == 0
    (cli_env / "r.csv").write_text("u,i,r\n" + "".join(f"u{u},i{(u * 5 + k) % 12},{1 + (u + k) % 5}\n"
                                                       for u in range(40) for k in range(4)))
    assert cli.main(["import-csv", str(cli_env / "r.csv"), "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--epsilon", "1"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    with session_scope(get_settings().database_url) as s:
        actor = s.execute(text("SELECT actor FROM training_runs WHERE id = :i"), {"i": run_id}).scalar_one()
    assert actor == f"cli:{pwd.getpwuid(os.getuid()).pw_name}"
    # the operator cancels the queued run as the admin API does: refunded (it read nothing), idempotent
    assert cli.main(["cancel-run", str(run_id)]) == 0
    cancelled = json.loads(capsys.readouterr().out)
    assert cancelled == {"id": run_id, "status": "failed", "stage": "cancelled", "cancelled": True,
                         "refunded": True, "private_data_read": False, "epsilon_charged": cancelled["epsilon_charged"]}
    assert cli.main(["cancel-run", str(run_id)]) == 0 and json.loads(capsys.readouterr().out) == cancelled
    with pytest.raises(SystemExit, match=r"^privrec cancel-run: training run 999 not found"):
        cli.main(["cancel-run", "999"])


# ---------------------------------------------------------------------------- container health checks
def _healthcheck(role: str | None, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "healthcheck", *([role] if role else [])], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_the_healthcheck_finds_the_role_pid_1_runs() -> None:
    assert cli.role_of(b"/usr/bin/tini\0--\0privrec\0worker\0") == "worker"
    assert cli.role_of(b"/usr/bin/tini\0--\0/opt/venv/bin/privrec\0beat\0--loglevel\0INFO\0") == "beat"
    assert cli.role_of(b"/usr/bin/tini\0--\0privrec\0") is None
    assert cli.role_of(b"/sbin/init\0") is None


def test_api_healthcheck_fails_when_nothing_answers(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = _healthcheck("api", {**_env(tmp_path), "API_PORT": str(port)}, tmp_path)
    assert done.returncode == 1 and done.stderr.startswith("privrec healthcheck api: /health does not answer")
    assert _healthcheck(None, _env(tmp_path), tmp_path).returncode == 0  # PID 1 here runs no privrec role
