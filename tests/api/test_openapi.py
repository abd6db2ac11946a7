"""The committed openapi.yaml equals what the app serves; every route documents the error shape."""

from __future__ import annotations

from pathlib import Path

from app.api.openapi_yaml import to_yaml
from tests.api.conftest import Env

ROOT = Path(__file__).resolve().parents[2]


def test_committed_openapi_yaml_matches_the_served_document(sqlite_env: Env) -> None:
    served = sqlite_env.client.get("/openapi.json").json()
    committed = (ROOT / "openapi.yaml").read_text(encoding="utf-8")
    assert committed == to_yaml(served), (
        "openapi.yaml is stale: regenerate it with `privrec openapi > openapi.yaml`"
    )


def test_every_operation_lists_the_error_shape(sqlite_env: Env) -> None:
    doc = sqlite_env.client.get("/openapi.json").json()
    assert "ErrorResponse" in doc["components"]["schemas"]
    n = 0
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            n += 1
            for code in ("400", "401", "403", "404", "409", "413", "422", "500"):
                ref = op["responses"][code]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorResponse"), (method, path, code)
    assert n >= 25


def test_yaml_emitter_known_output() -> None:
    doc = {"a": [{"b": 1.5, "c": [True, None, "x: y"]}, [1, 2], {}], "e": {}, "f": "multi\nline \"q\""}
    assert to_yaml(doc) == (
        '"a":\n'
        '  - "b": 1.5\n'
        '    "c":\n'
        '      - true\n'
        '      - null\n'
        '      - "x: y"\n'
        '  - - 1\n'
        '    - 2\n'
        '  - {}\n'
        '"e": {}\n'
        '"f": "multi\\nline \\"q\\""\n'
    )
