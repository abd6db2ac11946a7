"""The dashboard in a real browser (Debian chromium + chromedriver via Selenium) against
`privrec serve`: sign in, the chart has a UTC time axis, one point per run at its last ledger
entry's time, both caps drawn and the person budget's cap change marked; a gauge per cap (data set,
person budget, current block) with its state (ok, low, exhausted) as a class and in words; the
remaining ε, the binding cap (data set's or person budget's) and the affordable runs are the admin
API's; start a training with an objective chosen from the algorithm's and watch it reach
"published" without reloading, activate the older version and see the served model change; the
page refreshes itself (pausable) and keeps what the form holds; a fresh data set shows its empty
states; the page runs under its Content-Security-Policy without a single violation; after sign-out
the session cookie copied before it opens nothing. Screenshots go to tests/artifacts/screenshots
(git-ignored)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import PRIVREC, ROOT, base_env, free_port, wait_http, wait_run

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("PRIVREC_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PRIVREC_CHROMEDRIVER", shutil.which("chromedriver") or "/usr/bin/chromedriver")
SHOTS = ROOT / "tests" / "artifacts" / "screenshots"


def _require_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser missing under CI=true: {missing} (apt-get install chromium chromium-driver)")
        pytest.skip(f"browser missing: {missing}")


def _driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1600",
                "--disable-gpu"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, CSP reports included
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _csp_violations(driver) -> list[str]:  # type: ignore[no-untyped-def]
    """Console messages of the page so far that report a Content-Security-Policy violation."""
    return [entry["message"] for entry in driver.get_log("browser")
            if "content security policy" in entry["message"].lower()]


CSP_PROBE = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__cspViolations.push(e.violatedDirective));
"""


def _wait(predicate: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - element not there yet
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}: {last!r}")


CAP_NAMES = {"dataset": "data set cap (default)", "person_budget": "person budget cap (all)"}


def _caps_shown(driver, client: httpx.Client, admin: dict[str, str]) -> bool:  # type: ignore[no-untyped-def]
    """Whether the page shows what the admin API returns now: the binding remaining ε, the cap that
    binds (named), each cap's remaining ε and the affordable runs at the page's ε = 1."""
    from selenium.webdriver.common.by import By

    def shown(element: str) -> str:
        return str(driver.find_element(By.ID, element).text)

    def cap(element: str) -> str:
        return str(driver.find_element(By.ID, element).get_attribute("data-cap"))

    budget = client.get("/v1/admin/datasets/default/budget", headers=admin).json()
    plan = client.get("/v1/admin/datasets/default/budget/projection", headers=admin, params={"epsilon": 1}).json()
    affordable = f"{plan['affordable_runs']}{'+' if plan['affordable_runs_capped'] else ''}"
    return (float(shown("remaining")) == budget["remaining_epsilon"]
            and cap("binding-cap") == budget["binding_cap"] and shown("binding-cap") == CAP_NAMES[budget["binding_cap"]]
            and float(shown("dataset-remaining")) == budget["dataset_remaining_epsilon"]
            and shown("person-remaining").endswith(" (all)")
            and float(shown("person-remaining").split()[0]) == budget["person_budget"]["remaining_epsilon"]
            and shown("affordable") == affordable
            and cap("projection-binding") == plan["binding_cap"]
            and shown("projection-binding") == CAP_NAMES[plan["binding_cap"]])


def _blocks_shown(driver, client: httpx.Client, admin: dict[str, str]) -> bool:  # type: ignore[no-untyped-def]
    """Whether the block table shows the admin API's first page of blocks (current period first, with
    cap, spend by RDP and PLD, runs, runs left and retirement), and the banner its forecast's warnings."""
    from selenium.webdriver.common.by import By

    page = client.get("/v1/admin/datasets/default/budget/blocks", headers=admin, params={"limit": 10}).json()
    rows = driver.find_elements(By.CSS_SELECTOR, "#block-rows tr")
    expected = [[b["cohort"], str(b["epsilon_cap"]), str(b["spent_epsilon_rdp"]), str(b["spent_epsilon_pld"]),
                 str(b["remaining_epsilon"]), str(b["n_runs"]),
                 "" if b["runs_left"] is None else f"{b['runs_left']}{'+' if b['runs_left_capped'] else ''}",
                 "retired" if b["retired"] else (b["retires_at"] or "")] for b in page["items"]]
    shown = [[td.text for td in r.find_elements(By.TAG_NAME, "td")] for r in rows]
    warnings = client.get("/v1/admin/datasets/default/budget/forecast", headers=admin).json()["warnings"]
    banner = driver.find_element(By.ID, "block-warning")
    ok = (_same_cells(shown, expected) and f"of {page['total']} (current first)" in
          driver.find_element(By.ID, "blocks-page").text
          and banner.is_displayed() == bool(warnings)
          and [p.text for p in banner.find_elements(By.TAG_NAME, "p")] == warnings)
    return ok or _Mismatch(f"shown {shown} expected {expected}; banner {banner.text!r} warnings {warnings}")


class _Mismatch(str):
    """A falsy answer of a wait's predicate that says what differed (in the timeout's message)."""

    def __bool__(self) -> bool:
        return False


def _same_cells(shown: list[list[str]], expected: list[list[str]]) -> bool:
    """Cell by cell; numbers compared as numbers (the page prints JavaScript's form, e.g. 10 for 10.0),
    forecast times within a minute (before the first scheduled run the next one is "now", so each
    request's forecast moves with the clock)."""
    def same(a: str, b: str) -> bool:
        try:
            return float(a) == float(b)
        except ValueError:
            pass
        try:
            return abs(datetime.fromisoformat(a) - datetime.fromisoformat(b)) <= timedelta(minutes=1)
        except ValueError:
            return a == b
    return len(shown) == len(expected) and all(
        len(r) == len(e) and all(map(same, r, e)) for r, e in zip(shown, expected, strict=True))


LOW_SHARE = 0.25  # the page calls a cap "low" under a quarter left
TICK_LABEL = re.compile(r"^(\d\d [A-Z][a-z]{2} )?\d\d:\d\d(:\d\d)?$|^\d\d [A-Z][a-z]{2}( \d{4})?$")


def _state(remaining: float, cap: float) -> str:
    return "exhausted" if remaining <= 0 else "low" if remaining < LOW_SHARE * cap else "ok"


def _gauges_shown(driver, client: httpx.Client, admin: dict[str, str],  # type: ignore[no-untyped-def]
                  dataset: str = "default") -> bool | _Mismatch:
    """Whether the gauges show each cap's remaining ε out of the cap as the admin API returns them:
    the data set's, the person budget's and the current block's (one not opened yet: nothing
    spent), each with its state as a class, a data attribute and in words."""
    from selenium.webdriver.common.by import By

    budget = client.get(f"/v1/admin/datasets/{dataset}/budget", headers=admin).json()
    pb = budget["person_budget"]
    expected = {"dataset": (budget["dataset_remaining_epsilon"], budget["epsilon_cap"]),
                "person": (pb["remaining_epsilon"], pb["epsilon_cap"])}
    if budget["current_block"] is not None:
        first = client.get(f"/v1/admin/datasets/{dataset}/budget/blocks", headers=admin,
                           params={"limit": 1}).json()["items"]
        current = [b for b in first if b["cohort"] == budget["current_block"]]
        expected["block"] = ((current[0]["remaining_epsilon"], current[0]["epsilon_cap"]) if current
                             else (budget["epsilon_cap"], budget["epsilon_cap"]))
    gauges = {g.get_attribute("id"): g for g in driver.find_elements(By.CSS_SELECTOR, "#gauges .gauge")}
    if set(gauges) != {f"gauge-{k}" for k in expected}:
        return _Mismatch(f"gauges {sorted(gauges)} expected {sorted(expected)}")
    for kind, (remaining, cap) in expected.items():
        g, state = gauges[f"gauge-{kind}"], _state(remaining, cap)
        shown = (g.get_attribute("data-state"), float(g.get_attribute("data-remaining")),
                 float(g.get_attribute("data-cap")), f"state-{state}" in g.get_attribute("class").split(),
                 g.find_element(By.CLASS_NAME, "gauge-state").text.split(":")[0])
        if shown != (state, remaining, cap, True, state):
            return _Mismatch(f"{kind}: shown {shown}, expected {(state, remaining, cap, True, state)}")
    return True


def _gauge_state(driver, kind: str) -> str:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.ID, f"gauge-{kind}").get_attribute("data-state"))


def _displayed(driver, element: str) -> bool:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    return bool(driver.find_element(By.ID, element).is_displayed())


def _at(value: str) -> datetime:
    at = datetime.fromisoformat(value)
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def _chart_shown(driver, client: httpx.Client,  # type: ignore[no-untyped-def]
                 admin: dict[str, str]) -> bool | _Mismatch:
    """Whether the chart has one point per run of the ledger, at the time of the run's last entry and
    in time order along x, readable UTC time ticks, and both caps drawn at the API's values."""
    from selenium.webdriver.common.by import By

    entries = sorted(client.get("/v1/admin/datasets/default/ledger", headers=admin,
                                params={"limit": 1000}).json()["items"], key=lambda e: e["seq"])
    last = {e["run_id"]: e for e in entries if e["run_id"] is not None}
    points = driver.find_elements(By.CSS_SELECTOR, "#chart svg circle.pt[data-run]")
    runs = [int(p.get_attribute("data-run")) for p in points]
    if sorted(runs) != sorted(last):
        return _Mismatch(f"points for runs {runs}, ledger runs {sorted(last)}")
    times = {int(p.get_attribute("data-run")): (_at(p.get_attribute("data-at")), float(p.get_attribute("cx")))
             for p in points}
    if any(times[r][0] != _at(last[r]["created_at"]) for r in last):
        return _Mismatch(f"point times {times} differ from the ledger's")
    by_time = sorted(times.values())
    if any(a[1] > b[1] for a, b in zip(by_time, by_time[1:], strict=False)):
        return _Mismatch(f"x does not grow with time: {by_time}")
    ticks = driver.find_elements(By.CSS_SELECTOR, "#chart svg g.tick.x")
    labels = [t.find_element(By.TAG_NAME, "text").text for t in ticks]
    tick_times = [_at(t.get_attribute("data-at")) for t in ticks]
    if len(ticks) < 2 or not all(TICK_LABEL.match(label) for label in labels) or tick_times != sorted(tick_times):
        return _Mismatch(f"time ticks {labels}")
    budget = client.get("/v1/admin/datasets/default/budget", headers=admin).json()
    caps = {c.get_attribute("class"): float(c.get_attribute("data-cap"))
            for c in driver.find_elements(By.CSS_SELECTOR, "#chart svg g.cap")}
    want = {"cap cap-dataset": budget["epsilon_cap"], "cap cap-person": budget["person_budget"]["epsilon_cap"]}
    return caps == want or _Mismatch(f"caps {caps} expected {want}")


def test_dashboard_in_a_real_browser(spawn, tmp_path: Path) -> None:
    _require_browser()
    from selenium.webdriver.common.by import By

    port = free_port()
    env = base_env(EMBEDDED_POLL_S="0.5")
    proc = spawn([PRIVREC, "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)], env, "serve")
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/health", proc, timeout=90)
    token = subprocess.run([PRIVREC, "issue-token", "--admin"], env={**env, "DATABASE_URL": "sqlite://"},
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    admin = {"Authorization": f"Bearer {token}"}
    SHOTS.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=base, timeout=30) as client:
        demo = client.get("/v1/admin/datasets/default/trainings", headers=admin).json()["items"][0]
        assert wait_run(client, demo["id"], admin, [proc])["status"] == "succeeded"
        first_version = client.get("/v1/datasets/default/model").json()["model_version"]
        driver = _driver()
        try:
            driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_PROBE})
            page = httpx.get(f"{base}/dashboard")
            assert "script-src 'self'" in page.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
            assert page.headers["cache-control"] == "no-store"
            driver.get(f"{base}/dashboard")
            driver.find_element(By.ID, "token").send_keys(token)
            driver.find_element(By.CSS_SELECTOR, "#login button").click()
            _wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#chart svg circle.pt"), 30, "the chart")
            assert token not in driver.current_url
            assert driver.execute_script("return document.cookie") == ""  # HttpOnly: invisible to scripts
            assert driver.execute_script("return window.localStorage.length") == 0
            _wait(lambda: _chart_shown(driver, client, admin), 30, "the chart over time, one point per run")
            assert not driver.find_element(By.ID, "chart-empty").is_displayed()
            assert "updated " in driver.find_element(By.ID, "updated").text
            # the gauges: every cap with room left at the defaults
            _wait(lambda: _gauges_shown(driver, client, admin), 30, "the gauges the API returns")
            assert [_gauge_state(driver, k) for k in ("dataset", "person", "block")] == ["ok", "ok", "ok"]
            assert "verified" in driver.find_element(By.ID, "chain").text
            assert driver.find_element(By.ID, "account-relation").text == "add_or_remove_one_user"
            assert driver.find_element(By.ID, "person-budget").text.startswith("all: spent ")
            _wait(lambda: "composes to" in driver.find_element(By.ID, "projection").text, 30, "the projection")
            _wait(lambda: _caps_shown(driver, client, admin), 30, "the caps the API returns")
            cells = [td.text for td in driver.find_elements(By.CSS_SELECTOR, f'#runs tr[data-run="{demo["id"]}"] td')]
            assert cells[6:8] == [demo["trigger"], demo["actor"]] and cells[9].endswith(("s", "min")), cells
            # the privacy blocks, current period first, with their forecast; no warning at the defaults
            _wait(lambda: _blocks_shown(driver, client, admin), 30, "the blocks the API returns")
            cohorts = [r.get_attribute("data-cohort") for r in driver.find_elements(By.CSS_SELECTOR, "#block-rows tr")]
            assert cohorts[0] != "legacy" and cohorts[-1] == "legacy"
            assert not driver.find_element(By.ID, "block-warning").is_displayed()
            driver.save_screenshot(str(SHOTS / "01-signed-in.png"))

            # the objective selector offers what the selected algorithm takes
            from selenium.webdriver.support.ui import Select

            algo, objective = Select(driver.find_element(By.ID, "train-algo")), driver.find_element(By.ID, "train-objective")
            assert algo.first_selected_option.get_attribute("value") == "dpals"
            assert [o.get_attribute("value") for o in Select(objective).options] == ["", "rating", "ranking"]
            algo.select_by_value("dpfw")
            assert not objective.is_enabled() and [o.get_attribute("value") for o in Select(objective).options] == [""]
            algo.select_by_value("dpals")
            Select(objective).select_by_value("ranking")

            # start a training from the page and watch it without reloading
            marker = driver.execute_script("window.__noReload = 1; return window.__noReload")
            eps = driver.find_element(By.ID, "train-eps")
            eps.clear()
            eps.send_keys("1")
            driver.find_element(By.ID, "train-start").click()
            new_run = _wait(lambda: [r for r in driver.find_elements(By.CSS_SELECTOR, "#runs tr")
                                     if int(r.get_attribute("data-run")) > demo["id"]], 30, "the new run")[0]
            run_id = int(new_run.get_attribute("data-run"))
            started = client.get(f"/v1/admin/trainings/{run_id}", headers=admin).json()
            assert started["algorithm"] == "dpals" and started["config"]["objective"] == "ranking", started
            stages: set[str] = set()

            def published() -> bool:
                row = driver.find_element(By.CSS_SELECTOR, f'#runs tr[data-run="{run_id}"]')
                stages.add(row.get_attribute("data-stage"))
                return row.get_attribute("data-stage") == "published" and row.get_attribute("data-status") == "succeeded"

            _wait(published, 240, "the run to be published")
            assert driver.execute_script("return window.__noReload") == marker  # same page, no reload
            assert len(stages) >= 2, stages
            _wait(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#versions tr")) == 2, 30, "two versions")
            new_version = client.get("/v1/datasets/default/model").json()["model_version"]
            assert new_version != first_version
            assert "(ranking)" in driver.find_element(By.CSS_SELECTOR, f'#runs tr[data-run="{run_id}"]').text
            _wait(lambda: _chart_shown(driver, client, admin), 30, "the chart with the new run")
            _wait(lambda: _caps_shown(driver, client, admin), 30, "the caps after the run")
            driver.save_screenshot(str(SHOTS / "02-trained.png"))

            # roll back to the demo's version
            driver.find_element(By.CSS_SELECTOR, f'#versions tr[data-version="{first_version}"] button.activate').click()
            _wait(lambda: driver.find_element(By.ID, "served").get_attribute("data-version") == str(first_version),
                  30, "the served model to change")
            assert client.get("/v1/datasets/default/model").json()["model_version"] == first_version
            _wait(lambda: "newer version waits" in driver.find_element(By.ID, "pin").text, 30, "the pin banner")
            driver.save_screenshot(str(SHOTS / "03-rolled-back.png"))

            # the rollback sticks until unpinned; unpinning serves the newest version again
            driver.find_element(By.ID, "unpin").click()
            _wait(lambda: driver.find_element(By.ID, "served").get_attribute("data-version") == str(new_version),
                  30, "the newest version to be served again")
            assert driver.find_element(By.ID, "pin").text == ""

            # with the person budget's cap below the data set's, the page names it as the binding cap
            lowered = client.put("/v1/admin/person-budgets/all", headers=admin, json={"epsilon_cap": 5})
            assert lowered.status_code == 200, lowered.text
            driver.refresh()
            _wait(lambda: driver.find_element(By.ID, "binding-cap").get_attribute("data-cap") == "person_budget",
                  30, "the person budget to bind")
            assert "exceeds its person budget's (5" in driver.find_element(By.ID, "cap-warning").text
            _wait(lambda: _caps_shown(driver, client, admin), 30, "the caps under the person budget")
            # the cap change, from the person budget's hash-chained entries, newest first
            _wait(lambda: [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#cap-changes tr:first-child td")][3:5]
                  == ["10", "5"], 30, "the person budget's cap change")
            # ... drawn on the chart (the person cap line at 5) and marked there at its time
            _wait(lambda: _chart_shown(driver, client, admin), 30, "the chart with the person cap")
            history = client.get("/v1/admin/person-budgets/all", headers=admin).json()["history"]
            marks = driver.find_elements(By.CSS_SELECTOR, "#chart svg g.cap-change.scope-person")
            assert [(_at(m.get_attribute("data-at")), m.get_attribute("data-new")) for m in marks] == \
                [(_at(h["at"]), "5") for h in history if h["old_cap"] is not None], history

            # a retrain policy that spends the blocks within 14 intervals: the banner says so
            policy = client.put("/v1/admin/datasets/default/retrain-policy", headers=admin, json={"epsilon": 4})
            assert policy.status_code == 200, policy.text
            warnings = client.get("/v1/admin/datasets/default/budget/forecast", headers=admin).json()["warnings"]
            assert any("legacy block" in w for w in warnings), warnings
            driver.refresh()
            _wait(lambda: driver.find_element(By.ID, "block-warning").is_displayed(), 30, "the block warning banner")
            _wait(lambda: _blocks_shown(driver, client, admin), 30, "the blocks and the banner the API returns")
            driver.save_screenshot(str(SHOTS / "04-block-warning.png"))

            # the page refreshes itself: a change through the API shows without a reload, and what
            # the form holds stays; the person budget's gauge turns low, then exhausted
            marker = driver.execute_script("window.__noReload = 2; return window.__noReload")
            eps = driver.find_element(By.ID, "train-eps")
            eps.clear()
            eps.send_keys("2.5")
            spent = client.get("/v1/admin/person-budgets/all", headers=admin).json()["spent_epsilon_rdp"]
            low = client.put("/v1/admin/person-budgets/all", headers=admin,
                             json={"epsilon_cap": round(spent / (1 - LOW_SHARE / 2), 6), "reason": "browser test"})
            assert low.status_code == 200, low.text
            _wait(lambda: _gauge_state(driver, "person") == "low", 40, "the auto-refresh to show the low gauge")
            _wait(lambda: _gauges_shown(driver, client, admin), 30, "the gauges with the person budget low")
            assert "low: under 25 % left" in driver.find_element(By.ID, "gauge-person").text
            exhausted = client.put("/v1/admin/person-budgets/all", headers=admin, json={"epsilon_cap": spent})
            assert exhausted.status_code == 200 and exhausted.json()["remaining_epsilon"] == 0, exhausted.text
            _wait(lambda: _gauge_state(driver, "person") == "exhausted", 40, "the exhausted gauge")
            _wait(lambda: _gauges_shown(driver, client, admin), 30, "the gauges with the person budget exhausted")
            assert driver.execute_script("return window.__noReload") == marker  # refreshed in place
            assert driver.find_element(By.ID, "train-eps").get_attribute("value") == "2.5"
            driver.save_screenshot(str(SHOTS / "05-gauges.png"))
            # paused, then resumed: resuming refreshes at once
            toggle = driver.find_element(By.ID, "refresh-toggle")
            toggle.click()
            assert toggle.get_attribute("aria-pressed") == "true" and toggle.text == "Resume auto-refresh"
            raised = client.put("/v1/admin/person-budgets/all", headers=admin, json={"epsilon_cap": 10, "reason": "test"})
            assert raised.status_code == 200, raised.text
            toggle.click()
            assert toggle.get_attribute("aria-pressed") == "false" and toggle.text == "Pause auto-refresh"
            _wait(lambda: _gauge_state(driver, "person") == "ok", 30, "the refresh on resuming")

            # a fresh data set: empty states instead of empty tables and a blank chart
            fresh = client.post("/v1/admin/datasets", headers=admin, json={
                "name": "fresh", "rating_min": 1, "rating_max": 5, "epsilon_cap": 3, "delta": 1e-6})
            assert fresh.status_code == 201, fresh.text
            driver.get(f"{base}/dashboard?dataset=fresh")
            for empty in ("runs-empty", "versions-empty", "chart-empty"):
                _wait(partial(_displayed, driver, empty), 30, f"#{empty}")
            assert not driver.find_elements(By.CSS_SELECTOR, "#chart svg")
            assert not driver.find_elements(By.CSS_SELECTOR, "#runs tr, #versions tr")
            # the message, not an empty table (each table's own request may answer after the messages)
            _wait(lambda: not any(driver.find_element(By.CSS_SELECTOR, f"table:has(#{body})").is_displayed()
                                  for body in ("runs", "versions", "block-rows")), 30, "the empty tables hidden")
            assert "No training run yet" in driver.find_element(By.ID, "runs-empty").text
            assert "No spend yet" in driver.find_element(By.ID, "chart-empty").text
            _wait(lambda: _gauges_shown(driver, client, admin, "fresh"), 30, "the fresh data set's gauges")
            assert _gauge_state(driver, "dataset") == "ok"
            driver.save_screenshot(str(SHOTS / "06-empty.png"))

            # a write without the CSRF header is refused even with the cookie
            refused = driver.execute_script(
                "return fetch('/dashboard/api/datasets/default/models/1/activate', {method: 'POST'})"
                ".then(r => r.status)")
            assert refused == 403

            # the page ran under its CSP: the enforcing browser blocked nothing
            assert driver.execute_script("return window.__cspViolations") == []
            assert _csp_violations(driver) == []

            # sign out; the session cookie copied before it no longer opens the dashboard
            copied = driver.get_cookie("privrec_session")
            assert copied is not None
            driver.find_element(By.ID, "logout").click()
            _wait(lambda: driver.find_elements(By.ID, "token"), 30, "the sign-in page")
            assert driver.get_cookie("privrec_session") is None
            driver.add_cookie({k: copied[k] for k in ("name", "value", "path", "httpOnly", "sameSite")
                               if k in copied})
            driver.get(f"{base}/dashboard")
            assert driver.find_elements(By.ID, "token") and not driver.find_elements(By.ID, "budget")
            stale = httpx.get(f"{base}/dashboard/api/datasets/default/summary",
                              cookies={"privrec_session": copied["value"]})
            assert stale.status_code == 401 and stale.json()["error"]["code"] == "no_session"
            driver.save_screenshot(str(SHOTS / "07-signed-out.png"))
            assert driver.execute_script("return window.__cspViolations") == []
            assert _csp_violations(driver) == []
        finally:
            driver.quit()
    assert token not in proc.log.read_text(errors="replace")
