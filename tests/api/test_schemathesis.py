"""Schemathesis against the served schema on SQLite and PostgreSQL: every operation alone with admin
and user tokens (100 examples each), then workflows that follow the document's OpenAPI links (its
own and those Schemathesis infers: create a data set, train on it, follow and cancel the run, rate
an item and delete the rating, ...) with admin and service tokens. No 5xx, responses conform to
the schema, status codes and error codes are documented. Marked ``fuzz``; ``PRIVREC_FUZZ_EXAMPLES``
and ``PRIVREC_FUZZ_SCENARIOS`` scale it (the defaults are the CI run's)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Flaky
from schemathesis import checks

from app.api.contract import LINKS
from app.db.session import dispose_engines
from app.main import create_app
from tests.api.conftest import Env, _bootstrap, create_pg_database, make_settings, require_postgres

pytestmark = pytest.mark.fuzz

# The contract: no 5xx, responses conform to the schema, status codes are documented.
# (Schema-valid requests may still get 422 for rules the schema cannot state, e.g. a rating
# inside the data set's own range, so positive-data acceptance is not checked.)


def error_code_documented(ctx: object, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """An error response's code is one the operation lists under that status (``x-error-codes``)."""
    documented = case.operation.definition.raw.get("responses", {}).get(str(response.status_code), {})
    if response.status_code < 400 or "x-error-codes" not in documented:
        return
    code = response.json()["error"]["code"]
    if code not in documented["x-error-codes"]:
        raise AssertionError(f"{case.method} {case.path} answered {response.status_code} `{code}`, "
                             f"not among its documented {documented['x-error-codes']}")


CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.response_schema_conformance,
          checks.content_type_conformance, error_code_documented]
MAX_EXAMPLES = int(os.environ.get("PRIVREC_FUZZ_EXAMPLES", "100"))
SCENARIOS = int(os.environ.get("PRIVREC_FUZZ_SCENARIOS", "100"))  # link-following workflows
STEPS = 10  # calls per workflow at most


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def fuzz_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    drop = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'fuzz.db'}"
    else:
        require_postgres()
        url, drop = create_pg_database()
    s = make_settings(url, tmp)
    _bootstrap(s)
    with TestClient(create_app(s)) as client:
        yield Env(settings=s, client=client)
    dispose_engines()
    if drop is not None:
        drop()


def test_api_contract(fuzz_env: Env) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_env.client.app)
    tokens = (fuzz_env.token("root", "admin", ttl=3600), fuzz_env.token("user-1", ttl=3600))
    failures: list[str] = []
    n_operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        n_operations += 1

        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                  derandomize=True, database=None)
        def check(case) -> None:
            for token in tokens:
                case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=CHECKS)

        try:
            check()
        except Exception as exc:  # noqa: BLE001 - collect every operation's failure, then fail once
            failures.append(f"{operation.label}: {str(exc)[:1500]}")
    assert n_operations >= 40
    assert not failures, "\n\n".join(failures)


def test_api_workflows_follow_links(fuzz_env: Env) -> None:
    """Stateful: sequences of calls chained by the document's links, so later calls reach real
    resources (a created data set, a queued run, a stored rating) instead of 404s. The database
    outlives each workflow, so a replayed one meets another state: check failures are collected
    rather than raised (nothing is replayed to shrink them), and a run Hypothesis stops as flaky
    goes on with fresh workflows until SCENARIOS have run."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_env.client.app)
    admin = {"Authorization": f"Bearer {fuzz_env.token('root', 'admin', ttl=3600)}"}
    service = {"Authorization": "Bearer " + fuzz_env.token("frontend", "service", ("ingest", "act_for_users"),
                                                           ttl=3600)}
    failures: list[str] = []
    calls: list[str] = []
    started = [0]

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            started[0] += 1

        def get_call_kwargs(self, case: schemathesis.Case) -> dict:
            return {"headers": admin if case.path.startswith("/v1/admin/") else service}

        def validate_response(self, response: schemathesis.Response, case: schemathesis.Case,
                              additional_checks: object = None, **kwargs: object) -> None:
            calls.append(f"{case.method} {case.path} {response.status_code}")
            try:
                case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs or None)
            except Exception as exc:  # noqa: BLE001 - collected: a raised failure would be replayed
                failures.append(f"{case.method} {case.path}: {str(exc)[:1500]}")

    assert len(Workflow.bundles) >= 10  # links to follow (the document's and the inferred ones)
    for _ in range(20):
        if started[0] >= SCENARIOS or failures:
            break
        try:
            Workflow.run(settings=settings(max_examples=SCENARIOS - started[0], stateful_step_count=STEPS,
                                           deadline=None, suppress_health_check=list(HealthCheck), database=None,
                                           phases=[Phase.generate]))
        except Flaky:  # a replay met the state an earlier workflow left: go on with fresh ones
            continue
    assert not failures, "\n\n".join(failures[:5])
    assert started[0] >= SCENARIOS
    # links were followed to real resources: some link target answered other than 401/404/422
    targets = {f"{verb} {path}" for links in LINKS.values() for verb, path, _ in links.values()}
    followed = {c.rsplit(" ", 1)[0] for c in calls if not c.endswith((" 401", " 404", " 422"))}
    assert targets & followed, sorted(followed)
