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


def test_every_operation_documents_its_own_error_codes_in_the_error_shape(sqlite_env: Env) -> None:
    """Codes are derived per route (not 500 everywhere, which no status-code check could fail):
    503 on every /v1 route, 401/403 with a token, 404 with path parameters, 400/413 with a body;
    each status lists its codes (`x-error-codes`)."""
    doc = sqlite_env.client.get("/openapi.json").json()
    assert "ErrorResponse" in doc["components"]["schemas"]
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    n = 0
    for path, ops in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, op in ops.items():
            n += 1
            codes = set(op["responses"])
            assert "500" not in codes, (method, path)
            assert "503" in codes, (method, path)
            assert ("401" in codes and "403" in codes) == bool(op.get("security")), (method, path)
            # 404 only with path parameters, and only where a code says why (a PUT that creates the
            # addressed resource has none); an unknown data set is always `unknown_dataset`
            assert "404" not in codes or "{" in path, (method, path)
            if "{dataset}" in path:
                assert "unknown_dataset" in op["responses"]["404"]["x-error-codes"], (method, path)
            assert ("400" in codes and "413" in codes) == ("requestBody" in op), (method, path)
            for code in codes - {"200", "201", "202", "204"}:
                ref = op["responses"][code]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorResponse"), (method, path, code)
                assert op["responses"][code]["x-error-codes"], (method, path, code)
    assert n >= 25
    assert "409" in doc["paths"]["/v1/admin/datasets/{dataset}/trainings"]["post"]["responses"]
    assert "409" not in doc["paths"]["/v1/admin/datasets/{dataset}/trainings"]["get"]["responses"]


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
