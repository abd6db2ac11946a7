"""The dashboard in a real browser (Debian chromium + chromedriver via Selenium) against
`privrec serve`: sign in, the chart has one point per ledger entry, the remaining ε, the binding
cap (data set's or person budget's) and the affordable runs are the admin API's, start a training and watch it
reach "published" without reloading, activate the older version and see the served model change;
the page runs under its Content-Security-Policy without a single violation; after sign-out the
session cookie copied before it opens nothing. Screenshots go to tests/artifacts/screenshots
(git-ignored)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timedelta
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
            n_entries = client.get("/v1/admin/datasets/default/ledger", headers=admin).json()["total"]
            assert len(driver.find_elements(By.CSS_SELECTOR, "#chart svg circle.pt")) == n_entries
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

            # start a training from the page and watch it without reloading
            marker = driver.execute_script("window.__noReload = 1; return window.__noReload")
            eps = driver.find_element(By.ID, "train-eps")
            eps.clear()
            eps.send_keys("1")
            driver.find_element(By.ID, "train-start").click()
            new_run = _wait(lambda: [r for r in driver.find_elements(By.CSS_SELECTOR, "#runs tr")
                                     if int(r.get_attribute("data-run")) > demo["id"]], 30, "the new run")[0]
            run_id = int(new_run.get_attribute("data-run"))
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
            _wait(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#chart svg circle.pt")) ==
                  client.get("/v1/admin/datasets/default/ledger", headers=admin).json()["total"], 30, "chart update")
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

            # a retrain policy that spends the blocks within 14 intervals: the banner says so
            policy = client.put("/v1/admin/datasets/default/retrain-policy", headers=admin, json={"epsilon": 4})
            assert policy.status_code == 200, policy.text
            warnings = client.get("/v1/admin/datasets/default/budget/forecast", headers=admin).json()["warnings"]
            assert any("legacy block" in w for w in warnings), warnings
            driver.refresh()
            _wait(lambda: driver.find_element(By.ID, "block-warning").is_displayed(), 30, "the block warning banner")
            _wait(lambda: _blocks_shown(driver, client, admin), 30, "the blocks and the banner the API returns")
            driver.save_screenshot(str(SHOTS / "04-block-warning.png"))

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
            driver.save_screenshot(str(SHOTS / "05-signed-out.png"))
            assert driver.execute_script("return window.__cspViolations") == []
            assert _csp_violations(driver) == []
        finally:
            driver.quit()
    assert token not in proc.log.read_text(errors="replace")
