"""The privrec CLI: migrate, import-csv, issue-token, budget, openapi (in-process)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from app import cli
from app.auth import decode_token
from app.config import get_settings, reset_settings_cache
from app.db.session import dispose_engines

SECRET = "cli-tests-secret-0123456789abcdef-xyz"


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("SECRET_KEY", SECRET)
    monkeypatch.delenv("REDIS_URL", raising=False)
    reset_settings_cache()
    yield tmp_path
    dispose_engines()
    reset_settings_cache()


def test_migrate_import_budget(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["migrate"]) == 0
    path = cli_env / "r.csv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("user_id,item_id,rating\n")
        for u in range(50):
            for i in range(u % 7, 40, 7):
                fh.write(f"{u},{i},{1 + (u + i) % 5}\n")
        fh.write("0,0,4.5\n")  # a later duplicate wins
    items = cli_env / "items.csv"
    items.write_text("item_id,title,categories\n" + "".join(f"{i},Item {i},a|b\n" for i in range(40)))
    capsys.readouterr()
    assert cli.main(["import-items", str(items), "--chunk", "7"]) == 0
    assert json.loads(capsys.readouterr().out) == {"dataset": "default", "created": 40, "updated": 0}
    assert cli.main(["import-csv", str(path), "--chunk", "97", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    from sqlalchemy import text

    from app.db.session import session_scope

    with session_scope(get_settings().database_url) as s:
        n = s.execute(text("SELECT count(*) FROM ratings")).scalar_one()
        v = s.execute(text("SELECT value FROM ratings r JOIN users u ON u.id = r.user_id "
                           "JOIN items i ON i.id = r.item_id WHERE u.external_id = '0' AND i.external_id = '0'")).scalar_one()
    assert out["rows"] > 0 and n == sum(len(range(u % 7, 40, 7)) for u in range(50)) and v == 4.5
    assert cli.main(["budget"]) == 0
    budget = json.loads(capsys.readouterr().out)
    assert budget["dataset"] == "default" and budget["spent_epsilon_rdp"] == 0
    assert (budget["privacy_unit"], budget["privacy_unit_label"]) == ("user", "per user")  # every number names its unit
    assert cli.main(["budget", "--blocks"]) == 0
    assert all(b["privacy_unit_label"] == "per user" for b in json.loads(capsys.readouterr().out)["items"])


def test_import_refuses_out_of_range(cli_env: Path) -> None:
    cli.main(["migrate"])
    path = cli_env / "bad.csv"
    (cli_env / "items.csv").write_text("x\n")
    assert cli.main(["import-items", str(cli_env / "items.csv"), "--no-header"]) == 0
    path.write_text("u,i,r\na,x,4\nb,x,11\n")
    with pytest.raises(SystemExit, match="nothing was written"):
        cli.main(["import-csv", str(path), "--quiet"])
    from sqlalchemy import text

    from app.db.session import session_scope

    with session_scope(get_settings().database_url) as s:
        assert s.execute(text("SELECT count(*) FROM ratings")).scalar_one() == 0


def test_issue_token(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["issue-token", "--service", "front", "--scope", "ingest", "--ttl", "60"])
    p = decode_token(capsys.readouterr().out.strip(), secret=SECRET)
    assert p.kind == "service" and p.scopes == frozenset({"ingest"})
    cli.main(["issue-token", "--admin"])
    assert decode_token(capsys.readouterr().out.strip(), secret=SECRET).is_admin


def test_openapi_command_matches_committed_file(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["openapi"])
    assert capsys.readouterr().out == (Path(__file__).resolve().parents[2] / "openapi.yaml").read_text()


def test_multi_worker_listener_is_tcp_so_connections_get_nodelay() -> None:
    import asyncio
    import socket

    from app.api_workers import reuse_port_listeners

    sock, other = reuse_port_listeners("127.0.0.1", 0, 2)
    other.close()
    try:
        assert sock.proto == socket.IPPROTO_TCP and sock.get_inheritable()
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        port = sock.getsockname()[1]
        seen: list[int] = []

        async def main() -> None:
            async def handle(reader, writer) -> None:
                seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                writer.close()

            server = await asyncio.start_server(handle, sock=sock)
            _, w = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            w.close()
            server.close()

        asyncio.run(main())
        assert seen and seen[0] != 0
    finally:
        sock.close()


def test_multi_worker_listeners_refuse_a_port_in_use() -> None:
    """The SO_REUSEPORT group is bound only on a free port: a server already listening there
    (another `privrec api` included) makes `privrec api --workers 2` stop with one clear line
    instead of silently sharing the port's connections with it."""
    import socket

    from app.api_workers import reuse_port_listeners

    for reuse_port in (False, True):
        with socket.socket() as taken:
            if reuse_port:
                taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(OSError):
                reuse_port_listeners("127.0.0.1", port, 2)
            with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{port}"):
                cli.main(["api", "--port", str(port), "--workers", "2"])


def test_api_servers_keep_slow_starting_workers_and_log_no_raw_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """`privrec api` passes its options to uvicorn: a worker gets WORKER_HEALTHCHECK_S (not
    uvicorn's 5 s) to answer its first ping, and uvicorn's access log (raw paths name users) is off."""
    import uvicorn

    from app import api_workers

    seen: dict = {}
    monkeypatch.setenv("DATABASE_URL", "sqlite:///:memory:")  # the settings come from the environment
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: seen.update(options))
    monkeypatch.setattr(api_workers, "Supervisor",
                        lambda config, sockets: seen.update(config=config, sockets=sockets) or _NoRun())
    monkeypatch.setattr(api_workers, "reuse_port_listeners", lambda host, port, count: [None] * count)
    reset_settings_cache()
    try:
        cli.main(["api", "--port", "8123"])
        assert seen["access_log"] is False and seen["timeout_worker_healthcheck"] == cli.WORKER_HEALTHCHECK_S >= 30
        cli.main(["api", "--port", "8123", "--workers", "2"])
    finally:
        reset_settings_cache()
    config = seen["config"]
    assert config.workers == 2 and config.access_log is False and len(seen["sockets"]) == 2
    assert config.timeout_worker_healthcheck == cli.WORKER_HEALTHCHECK_S


def test_api_empties_the_metrics_folder_of_a_previous_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prometheus_client's multi-process mode sums every file in PROMETHEUS_MULTIPROC_DIR: `privrec api`
    creates the folder and removes a previous run's files before it starts its processes."""
    import uvicorn

    folder = tmp_path / "metrics"
    folder.mkdir()
    (folder / "counter_123.db").write_bytes(b"stale")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(folder))
    monkeypatch.setenv("DATABASE_URL", "sqlite:///:memory:")
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: None)
    reset_settings_cache()
    try:
        assert cli.main(["api", "--port", "8123"]) == 0
        assert folder.is_dir() and list(folder.iterdir()) == []
        folder.rmdir()
        assert cli.main(["api", "--port", "8123"]) == 0 and folder.is_dir()
    finally:
        reset_settings_cache()


class _NoRun:
    def run(self) -> int:
        return 0


def test_configuration_errors_are_one_line_without_the_secret(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).with_name("privrec"))
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "REDIS_URL", "DATABASE_URL")}
    out = subprocess.run([exe, "issue-token", "--admin"], env={**env, "SECRET_KEY": "short-s3cr3t"},
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "short-s3cr3t" not in out.stderr + out.stdout
    assert len(out.stderr.strip().splitlines()) == 1 and "SECRET_KEY" in out.stderr
    out = subprocess.run([exe, "budget"], env={**env, "DATABASE_URL": "postgresql://u:pw@127.0.0.1:1/x"},
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr and "pw" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "unreachable" in out.stderr


def test_service_token_without_scope_is_refused(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).with_name("privrec"))
    out = subprocess.run([exe, "issue-token", "--service", "frontend"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0 and "--scope" in out.stderr and "Traceback" not in out.stderr


def test_ratings_import_refuses_unknown_items_and_names_them(cli_env: Path) -> None:
    """The catalogue is public and comes only from public input: a rating never creates an item
    (an item rated by one user would exist iff that user is in the data)."""
    cli.main(["migrate"])
    (cli_env / "items.csv").write_text("item_id,title\nknown,Known\n")
    assert cli.main(["import-items", str(cli_env / "items.csv")]) == 0
    path = cli_env / "r.csv"
    path.write_text("u,i,r\na,known,4\nb,ghost,3\nc,phantom,2\n")
    with pytest.raises(SystemExit, match="unknown item") as err:
        cli.main(["import-csv", str(path), "--quiet"])
    assert "'ghost'" in str(err.value) and "'phantom'" in str(err.value) and "import-items" in str(err.value)
    with pytest.raises(SystemExit):
        cli.main(["import-csv", str(path), "--create-items", "--quiet"])  # the option is gone
    from sqlalchemy import text

    from app.db.session import session_scope

    with session_scope(get_settings().database_url) as s:
        assert s.execute(text("SELECT count(*) FROM ratings")).scalar_one() == 0
        assert s.execute(text("SELECT count(*) FROM items WHERE external_id IN ('ghost', 'phantom')")).scalar_one() == 0


def _chain() -> list[str]:
    """Every migration revision, oldest first, read from the scripts' ``down_revision`` links."""
    from alembic.script import ScriptDirectory

    from app.db.migrate import alembic_config, head_revision

    script, chain, rev = ScriptDirectory.from_config(alembic_config("sqlite://")), [], head_revision()
    while rev:
        chain.append(rev)
        rev = script.get_revision(rev).down_revision
    return chain[::-1]


def test_migrate_says_which_revisions_it_applied(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from alembic import command

    from app.db.migrate import alembic_config

    chain = _chain()
    assert len(chain) >= 4
    command.upgrade(alembic_config(f"sqlite:///{cli_env / 'cli.db'}"), chain[2])
    capsys.readouterr()
    assert cli.main(["migrate"]) == 0
    assert capsys.readouterr().out.startswith(f"applied {', '.join(chain[3:])};")
    assert cli.main(["migrate"]) == 0
    assert capsys.readouterr().out.startswith("already at the latest schema;")


def test_migrate_on_an_empty_database_applies_every_revision(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["migrate"]) == 0
    assert capsys.readouterr().out.startswith(f"applied {', '.join(_chain())};")


def _signed(lifetime_s: int, secret: str, *, iat: int | None = None) -> str:
    """An admin token signed with the right secret whose lifetime is ``lifetime_s``."""
    import time

    import jwt

    iat = int(time.time()) - 10 if iat is None else iat
    claims = {"iss": "privrec", "sub": "root", "typ": "admin", "scope": "admin", "iat": iat,
              "exp": iat + lifetime_s, "jti": "x"}
    return jwt.encode(claims, secret, algorithm="HS256")


def test_tokens_living_longer_than_the_maximum_are_refused_at_verification(tmp_path: Path) -> None:
    """A correctly signed token whose exp - iat exceeds MAX_TOKEN_TTL_S gets 401, on the API and
    the dashboard sign-in; one within it is accepted."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.api.conftest import SECRET as API_SECRET
    from tests.api.conftest import _bootstrap, make_settings

    settings = make_settings(f"sqlite:///{tmp_path / 'api.db'}", tmp_path).model_copy(
        update={"max_token_ttl_s": 7200})
    _bootstrap(settings)
    try:
        with TestClient(create_app(settings)) as client:
            def status(token: str) -> int:
                return client.get("/v1/admin/datasets", headers={"Authorization": f"Bearer {token}"}).status_code

            assert status(_signed(7200, API_SECRET)) == 200
            too_long = _signed(7201, API_SECRET)
            assert status(too_long) == 401
            assert client.post("/dashboard/session", json={"token": too_long}).status_code == 401
            assert client.post("/dashboard/session", json={"token": _signed(7200, API_SECRET)}).status_code == 204
    finally:
        dispose_engines()


def test_decode_token_checks_the_lifetime_claims() -> None:
    from app.auth import MAX_LIFETIME_S, TokenError, decode_token

    assert decode_token(_signed(MAX_LIFETIME_S, SECRET), secret=SECRET).is_admin
    for token in (_signed(MAX_LIFETIME_S + 1, SECRET), _signed(100, SECRET, iat=10**10)):
        with pytest.raises(TokenError):  # too long; issued in the future (exp - iat fine, but not yet valid)
            decode_token(token, secret=SECRET)
    with pytest.raises(TokenError, match="lifetime"):
        decode_token(_signed(61, SECRET), secret=SECRET, max_lifetime_s=60)


def test_issue_token_refuses_a_ttl_above_the_maximum(cli_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MAX_TOKEN_TTL_S", "7200")
    reset_settings_cache()
    with pytest.raises(SystemExit, match="MAX_TOKEN_TTL_S"):
        cli.main(["issue-token", "--admin", "--ttl", "7201"])
    assert cli.main(["issue-token", "--admin", "--ttl", "7200"]) == 0
    assert decode_token(capsys.readouterr().out.strip(), secret=SECRET, max_lifetime_s=7200).is_admin


def _seed_small(cli_env: Path) -> None:
    """Catalogue and ratings of a small public-shaped data set through the CLI imports."""
    (cli_env / "items.csv").write_text("item_id\n" + "".join(f"i{i}\n" for i in range(12)))
    assert cli.main(["import-items", str(cli_env / "items.csv")]) == 0
    (cli_env / "r.csv").write_text("u,i,r\n" + "".join(f"u{u},i{(u * 5 + k) % 12},{1 + (u + k) % 5}\n"
                                                       for u in range(40) for k in range(4)))
    assert cli.main(["import-csv", str(cli_env / "r.csv"), "--quiet"]) == 0


def test_train_follow_shows_the_stages_until_published(cli_env: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``privrec train --follow`` submits over the admin service path, a real embedded worker
    trains it, the bar walks the public stages to "published" and the command exits 0."""
    from sqlalchemy import text

    from app.db.session import session_scope
    from app.services.training.embedded_worker import EmbeddedWorker

    assert cli.main(["migrate"]) == 0
    _seed_small(cli_env)
    capfd.readouterr()
    worker = EmbeddedWorker(get_settings(), schedule=False).start()
    try:
        assert cli.main(["train", "--dataset", "default", "--epsilon", "1.5", "--follow", "--interval", "0.05"]) == 0
    finally:
        worker.stop()
    out, err = capfd.readouterr()
    lines = out.strip().splitlines()
    run_id = json.loads(lines[0])["run_id"]
    final = json.loads(lines[-1])
    assert final["id"] == run_id and final["status"] == "succeeded" and final["stage"] == "published"
    assert f"run {run_id}: published: 100%" in err
    with session_scope(get_settings().database_url) as s:
        assert s.execute(text("SELECT actor FROM training_runs WHERE id = :i"), {"i": run_id}).scalar_one().startswith("cli:")
        assert s.execute(text("SELECT count(*) FROM model_versions")).scalar_one() == 1


def test_train_without_follow_prints_the_queued_run_and_bad_input_submits_nothing(
        cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sqlalchemy import text

    from app.db.session import session_scope

    assert cli.main(["migrate"]) == 0
    _seed_small(cli_env)
    capsys.readouterr()
    assert cli.main(["train", "--epsilon", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "queued"
    with pytest.raises(SystemExit, match="nothing was submitted"):
        cli.main(["train", "--epsilon", "-1"])
    with pytest.raises(SystemExit, match="budget|cap|exceed"):
        cli.main(["train", "--epsilon", "50"])
    with session_scope(get_settings().database_url) as s:
        assert s.execute(text("SELECT count(*) FROM training_runs")).scalar_one() == 1


def test_train_follow_exits_1_when_the_run_fails(cli_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """A real failure in the worker (the artifact folder is a file, so publishing fails after the
    private read): the bar ends at "failed", the error is the fixed category, exit code 1."""
    from app.services.training.embedded_worker import EmbeddedWorker

    assert cli.main(["migrate"]) == 0
    _seed_small(cli_env)
    (cli_env / "not-a-folder").write_text("")
    monkeypatch.setenv("ARTIFACT_DIR", str(cli_env / "not-a-folder"))
    reset_settings_cache()
    capfd.readouterr()
    worker = EmbeddedWorker(get_settings(), schedule=False).start()
    try:
        assert cli.main(["train", "--epsilon", "1", "--follow", "--interval", "0.05"]) == 1
    finally:
        worker.stop()
    out, err = capfd.readouterr()
    final = json.loads(out.strip().splitlines()[-1])
    assert final["status"] == "failed" and final["stage"] == "failed" and final["error"]
    assert ": failed:" in err


def _run_on_a_terminal(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` with stderr on a 120-column pseudo-terminal; return (exit code, stderr)."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave,
                            cwd=cwd, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode()


@pytest.mark.parametrize("kind", ["import-csv", "import-votes"])
def test_import_bar_has_total_percent_eta_and_one_line_before_an_error(cli_env: Path, kind: str) -> None:
    """Lines are counted first, so the bar shows n/total, percent and an ETA; when a later chunk
    is refused the bar is closed once, the error follows on its own line and no bar comes after."""
    import os
    import sys

    assert cli.main(["migrate"]) == 0
    (cli_env / "items.csv").write_text("item_id\na\nb\n")
    assert cli.main(["import-items", str(cli_env / "items.csv")]) == 0
    value = "3" if kind == "import-csv" else "1"
    rows = [f"u{k},a,{value}" for k in range(30)] + [f"x,ghost,{value}"] + [f"v{k},b,{value}" for k in range(30)]
    (cli_env / "in.csv").write_text("u,i,r\n" + "\n".join(rows) + "\n")
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{cli_env / 'cli.db'}", "SECRET_KEY": SECRET}
    exe = str(Path(sys.executable).with_name("privrec"))
    code, err = _run_on_a_terminal([exe, kind, "in.csv", "--chunk", "10"], cli_env, env)
    assert code == 1
    lines = [line.rsplit("\r", 1)[-1] for line in err.replace("\r\n", "\n").split("\n") if line.strip("\r")]
    assert len(lines) == 2, lines
    bar, error = lines
    assert bar.startswith("import in.csv:  49%|") and "30/61 [" in bar and "<" in bar
    assert error.startswith(f"privrec {kind}:") and "ghost" in error and "import in.csv" not in error
    assert err.count("\n") == 2  # one bar line, one error line: nothing drawn after the error


def test_import_votes_bar_reaches_the_rows_read(cli_env: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["migrate"]) == 0
    (cli_env / "items.csv").write_text("item_id\na\n")
    assert cli.main(["import-items", str(cli_env / "items.csv")]) == 0
    (cli_env / "v.csv").write_text("u,i,v\n" + "".join(f"u{k},a,-1\n\n" for k in range(7)))  # blank lines
    capfd.readouterr()
    assert cli.main(["import-votes", str(cli_env / "v.csv"), "--chunk", "3"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["created"] == 7
    assert "100%|" in err and "7/7 [" in err


@pytest.mark.e2e
def test_serve_logs_the_demo_seeded_and_trained_and_how_to_get_a_token(tmp_path: Path) -> None:
    """`privrec serve` on an empty data folder: one line says the demo was seeded, one that it was
    trained, one how to get a token; the token it names then gets recommendations."""
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "ARTIFACT_DIR")}
    env.update(SECRET_KEY=SECRET, LOG_FORMAT="text")
    exe = str(Path(sys.executable).with_name("privrec"))
    proc = subprocess.Popen([exe, "serve", "--data-dir", str(tmp_path / "var"), "--port", str(port)],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any("issue-token --user" in line for line in lines):
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        seeded = [line for line in lines if "seeded with" in line]
        trained = [line for line in lines if "is trained" in line]
        token_line = [line for line in lines if "issue-token --user" in line]
        assert len(seeded) == 1 and len(trained) == 1 and len(token_line) == 1, "".join(lines)
        assert "published" in trained[0] and "privrec issue-token --user user-5" in token_line[0]
        out = subprocess.run([exe, "issue-token", "--user", "user-5"], env={
            **env, "DATABASE_URL": f"sqlite:///{tmp_path / 'var' / 'privrec.db'}"},
            capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/datasets/default/users/user-5/recommendations",
                                     headers={"Authorization": f"Bearer {out}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200 and json.loads(resp.read())["items"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_train_follow_interrupted_says_the_run_goes_on(cli_env: Path) -> None:
    """Ctrl-C while following (no worker here, so the run stays queued): one line, no traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time

    assert cli.main(["migrate"]) == 0
    _seed_small(cli_env)
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{cli_env / 'cli.db'}", "SECRET_KEY": SECRET}
    env.pop("REDIS_URL", None)
    exe = str(Path(sys.executable).with_name("privrec"))
    # a child of a shell's background job inherits SIGINT ignored: give it the default, as a terminal would
    proc = subprocess.Popen([exe, "train", "--epsilon", "1", "--follow", "--interval", "0.05", "--quiet"],
                            env=env, cwd=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    run_id = json.loads(proc.stdout.readline())["run_id"]
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err
    assert err.strip().splitlines() == [f"privrec train: stopped following run {run_id}; the run goes on "
                                        f"(GET /v1/admin/trainings/{run_id})"]


def _ratings_count() -> int:
    from sqlalchemy import text

    from app.db.session import session_scope

    with session_scope(get_settings().database_url) as s:
        return int(s.execute(text("SELECT count(*) FROM ratings")).scalar_one())


def _catalogue(cli_env: Path) -> None:
    cli.main(["migrate"])
    (cli_env / "items.csv").write_text("".join(f"i{k}\n" for k in range(5)))
    assert cli.main(["import-items", str(cli_env / "items.csv"), "--no-header"]) == 0


def test_import_csv_is_all_or_nothing_and_partial_says_what_it_kept(cli_env: Path) -> None:
    """A bad row after two committed-size chunks: by default nothing is written; with --partial
    the message names exactly the rows kept."""
    _catalogue(cli_env)
    path = cli_env / "r.csv"
    lines = [f"u{k},i{k % 5},3" for k in range(24)]
    lines[21] = "u21,i1,three"  # line 22 of the data
    path.write_text("user,item,rating\n" + "\n".join(lines) + "\n")
    with pytest.raises(SystemExit, match=r":23: rating is not a number; nothing was written \(the import is all"):
        cli.main(["import-csv", str(path), "--chunk", "10", "--quiet"])
    assert _ratings_count() == 0
    with pytest.raises(SystemExit, match="the first 20 rows were written and kept"):
        cli.main(["import-csv", str(path), "--chunk", "10", "--quiet", "--partial"])
    assert _ratings_count() == 20


@pytest.mark.parametrize("name, content", [
    ("garbage.csv.gz", b"this is not gzip at all\n"),
    ("truncated.csv.gz", (lambda z: z[:len(z) // 2])(gzip.compress(
        b"user,item,rating\n" + b"".join(b"u%d,i%d,3\n" % (k * 7919 % 10007, k % 5) for k in range(5000))))),
    ("latin1.csv", "user,item,rating\nJos\u00e9,i1,3\n".encode("latin-1")),
    ("nul.csv", b"user,item,rating\nu\x001,i1,3\n"),
])
@pytest.mark.parametrize("command", ["import-csv", "import-votes"])
def test_malformed_input_is_one_line_and_writes_nothing(cli_env: Path, name: str, content: bytes,
                                                        command: str) -> None:
    _catalogue(cli_env)
    path = cli_env / name
    path.write_bytes(content)
    with pytest.raises(SystemExit) as raised:
        cli.main([command, str(path), "--quiet"])
    message = str(raised.value.code)
    assert "\n" not in message and "nothing was written" in message and str(path) in message, message
    assert _ratings_count() == 0
