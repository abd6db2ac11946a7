"""Static checks of the Dockerfile and of the commands the README documents (docker cannot run here)."""

from __future__ import annotations

import re
from pathlib import Path

from app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_is_multi_stage_non_root_and_runs_privrec() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\w+)", text, flags=re.M)
    assert len(stages) >= 2 and "COPY --from=build" in text
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users and not users[-1].startswith(("root", "0"))
    assert re.search(r'^ENTRYPOINT \["privrec"\]', text, flags=re.M)
    for path in re.findall(r"^COPY\s+(?!--)(\S+)\s", text, flags=re.M):
        assert (ROOT / path).exists(), path


def test_readme_privrec_commands_exist_in_the_cli() -> None:
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    used = set(re.findall(r"(?:^|/bin/|`)privrec ([a-z][a-z-]+)", (ROOT / "README.md").read_text(), flags=re.M))
    used |= set(re.findall(r"docker run IMAGE ([a-z-]+)", (ROOT / "README.md").read_text()))
    documented = {"serve", "migrate", "api", "worker", "beat", "import-csv", "import-items", "issue-token", "budget", "openapi"}
    assert documented <= commands
    assert used and used <= commands, used - commands
