"""Operations: /metrics (admin only) after a training has its series; request ids echoed;
JSON log lines carry the request id and the route template, never the raw path or a body."""

from __future__ import annotations

import json
import logging

import pytest

from app.api.observability import JsonFormatter
from tests.api.conftest import Env, seed_ratings, train_and_publish


def test_metrics_after_a_training(env: Env) -> None:
    seed_ratings(env)
    train_and_publish(env, epsilon=1.0)
    assert env.client.get("/metrics").status_code == 401
    assert env.client.get("/metrics", headers=env.auth("alice")).status_code == 403
    r = env.client.get("/metrics", headers=env.admin)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    body = r.text
    assert 'privrec_training_runs{algorithm="dpals",dataset="default",status="succeeded"} 1.0' in body
    assert 'privrec_budget_cap_epsilon{dataset="default"} 10.0' in body
    assert 'privrec_budget_spent_epsilon{dataset="default"}' in body
    assert ('privrec_http_requests_total{method="POST",route="/v1/admin/datasets/{dataset}/trainings",'
            'status="202"}') in body
    assert ('privrec_http_request_duration_seconds_bucket{le="0.001",method="POST",'
            'route="/v1/datasets/{dataset}/ratings/batch"}') in body
    assert "u1" not in body and "duration" not in body.replace("privrec_http_request_duration", "")


def test_request_id_is_echoed_or_made(sqlite_env: Env) -> None:
    r = sqlite_env.client.get("/health", headers={"X-Request-ID": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    made = sqlite_env.client.get("/health", headers={"X-Request-ID": "bad id\nwith newline"}).headers["x-request-id"]
    assert len(made) == 32 and "\n" not in made


def test_access_log_is_json_with_route_template(sqlite_env: Env, caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("privrec.access")
    logger.propagate = True
    with caplog.at_level(logging.INFO, logger="privrec.access"):
        sqlite_env.client.put("/v1/datasets/default/users/secret-user/ratings/i0", headers=sqlite_env.auth("secret-user"),
                              json={"rating": 4.0}, )
    lines = [JsonFormatter().format(rec) for rec in caplog.records if rec.name == "privrec.access"]
    assert lines
    line = json.loads(lines[-1])
    assert line["http"]["route"] == "/v1/datasets/{dataset}/users/{user_id}/ratings/{item_id}"
    assert "secret-user" not in lines[-1] and "4.0" not in lines[-1]
    assert line["msg"] == "request" and line["level"] == "info"
