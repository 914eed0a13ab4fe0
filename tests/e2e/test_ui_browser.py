"""The UI in a real browser (headless Chromium and chromedriver from Debian's packages, through Selenium), on a store
filled by the collector from `tracemill simulate`: a reviewer signs in, opens a trace, edits a medical call in the
review queue and approves it; the store holds the decision and `tracemill mine` exports that call with the edit as its
`gold` reference; a viewer's attempt to decide is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tracemill.store import learning, queries
from tracemill.store.engine import make_engine
from tracemill.ui import users
from tracemill.ui.access import Role

from support import CHROMEDRIVER, CHROMIUM, CollectorProcess, UIProcess, chromium

PASSWORD = "a long enough password"
REQUIRE_BROWSER = os.environ.get("TRACEMILL_REQUIRE_BROWSER") == "1"

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    reason = f"no browser: {CHROMIUM} and {CHROMEDRIVER} come from `apt-get install chromium chromium-driver`"
    if REQUIRE_BROWSER:
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason, allow_module_level=True)

from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[tuple[UIProcess, str]]:
    from tracemill.simulate import simulate

    url = f"sqlite:///{tmp_path / 'tracemill.db'}"
    collector = CollectorProcess(url, tmp_path).start()
    try:
        simulate(collector.url, traces=40, seed=2)  # a store with failed medical calls to correct
    finally:
        collector.stop()
    engine = make_engine(url)
    users.add_user(engine, "rita", Role.REVIEWER, PASSWORD)
    users.add_user(engine, "vic", Role.VIEWER, PASSWORD)
    engine.dispose()
    process = UIProcess(url, tmp_path).start()
    yield process, url
    process.stop()


def wait_for(find: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            found = find()
            if found:
                return found
        except (WebDriverException, StaleElementReferenceException) as exc:
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"not found within {timeout}s: {last}")


def button(driver: WebDriver, label: str) -> WebElement:
    return wait_for(lambda: next((b for b in driver.find_elements(By.TAG_NAME, "button")
                                  if b.text.strip().startswith(label) and b.is_displayed()), None))


def text_of(driver: WebDriver) -> str:
    return driver.find_element(By.TAG_NAME, "body").text


def sign_in(driver: WebDriver, base: str, name: str) -> None:
    driver.get(base)
    wait_for(lambda: driver.find_element(By.CSS_SELECTOR, "input[aria-label='Name']")).send_keys(name)
    driver.find_element(By.CSS_SELECTOR, "input[type='password']").send_keys(PASSWORD, Keys.ENTER)
    wait_for(lambda: "Traces" in [h.text for h in driver.find_elements(By.TAG_NAME, "h1")])


def open_page(driver: WebDriver, title: str) -> None:
    wait_for(lambda: next((a for a in driver.find_elements(By.CSS_SELECTOR, "[data-testid='stSidebarNavLink']")
                           if a.text.strip().endswith(title)), None)).click()
    wait_for(lambda: title in [h.text for h in driver.find_elements(By.TAG_NAME, "h1")])


def choose(driver: WebDriver, label: str, option_text: str) -> None:
    box = wait_for(lambda: next((b for b in driver.find_elements(By.CSS_SELECTOR, "[data-testid='stSelectbox']")
                                 if b.text.startswith(label)), None))
    box.find_element(By.TAG_NAME, "input").click()
    option = wait_for(lambda: next((o for o in driver.find_elements(By.CSS_SELECTOR, "[role='option']")
                                    if option_text in o.text), None))
    option.click()


def idle(driver: WebDriver) -> None:
    """Wait until the app has finished running its script (the status widget shows while it runs)."""
    time.sleep(0.5)
    wait_for(lambda: not driver.find_elements(By.CSS_SELECTOR, "[data-testid='stStatusWidget']"))


def medical_item(driver: WebDriver) -> WebElement:
    open_page(driver, "Review queue")
    button(driver, "medical").click()
    wait_for(lambda: driver.find_element(By.CSS_SELECTOR, "textarea[aria-label='Call']"))
    idle(driver)
    return driver.find_element(By.CSS_SELECTOR, "textarea[aria-label='Call']")


def shown_item(driver: WebDriver) -> tuple[int, dict[str, Any]] | None:
    """(call id, the call in the editor) of the item the review page shows, once its editor is drawn."""
    boxes = driver.find_elements(By.CSS_SELECTOR, "[class*='st-key-edit_']")
    if not boxes:
        return None
    key = next(c for c in boxes[0].get_attribute("class").split() if c.startswith("st-key-edit_"))
    return int(key.removeprefix("st-key-edit_")), json.loads(boxes[0].find_element(By.TAG_NAME, "textarea")
                                                             .get_attribute("value"))


def test_a_reviewer_edits_and_approves_a_medical_call_and_a_viewer_is_refused(  # type: ignore[no-untyped-def]
        ui, tmp_path: Path) -> None:
    process, url = ui
    engine = make_engine(url)
    driver = chromium(tmp_path / "profile-rita")
    try:
        sign_in(driver, process.url, "rita")
        choose(driver, "Open trace", "invoke_agent")
        wait_for(lambda: "Trace " in text_of(driver) and "Raw output" in text_of(driver))

        medical_item(driver)
        for _ in range(30):  # skip to a failed medical call with a number to correct: the miner's gold is for those
            idle(driver)
            call_id, call = wait_for(lambda: shown_item(driver))
            number = next((k for k, v in call["arguments"].items() if type(v) in (int, float)), None)
            with engine.connect() as conn:
                stored = queries.call(conn, call_id)
            if number is not None and stored is not None and stored.failed:
                break
            number = None
            button(driver, "Skip").click()
            wait_for(lambda: (shown_item(driver) or (call_id,))[0] != call_id)  # noqa: B023
        idle(driver)
        editor = driver.find_element(By.CSS_SELECTOR, f".st-key-edit_{call_id} textarea")
        assert number is not None, "no failed medical call with a number to edit"
        call["arguments"][number] += 1  # the reviewer's correction, typed in below
        editor.send_keys(Keys.CONTROL, "a")
        editor.send_keys(Keys.DELETE)
        editor.send_keys('{"name": "not a tool", "arguments": {}}')
        button(driver, "Approve").click()
        wait_for(lambda: "does not pass the verifier" in text_of(driver))
        with engine.connect() as conn:
            assert learning.review(conn, call_id) is None
        editor = wait_for(lambda: driver.find_element(By.CSS_SELECTOR, "textarea[aria-label='Call']"))
        editor.send_keys(Keys.CONTROL, "a")
        editor.send_keys(Keys.DELETE)
        editor.send_keys(json.dumps(call))
        editor.send_keys(Keys.CONTROL, Keys.ENTER)  # the keyboard way to approve
        decided = wait_for(lambda: learning.review(engine.connect(), call_id))
        assert decided.reviewer == "rita" and decided.after == call and decided.decision == "edit"
    finally:
        driver.quit()

    mined = subprocess.run([sys.executable, "-m", "tracemill.cli", "mine", "--db", url, "--out",
                            str(tmp_path / "mined"), "--workers", "1"], capture_output=True, text=True, timeout=300,
                           check=False)
    assert mined.returncode == 0, mined.stderr
    rows = [json.loads(line) for split in ("train", "eval")
            for line in (tmp_path / "mined" / f"{split}.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["call_id"] == call_id)
    assert row["provenance"] == "gold" and json.loads(row["reference"]) == [call]

    driver = chromium(tmp_path / "profile-vic")
    try:
        sign_in(driver, process.url, "vic")
        medical_item(driver)
        wait_for(lambda: "masked" in text_of(driver))
        with engine.connect() as conn:
            before = len(learning.reviews(conn))
        button(driver, "Approve").click()
        wait_for(lambda: "Refused" in text_of(driver) and "only reviewers and admins decide" in text_of(driver), 60)
        with engine.connect() as conn:
            assert len(learning.reviews(conn)) == before
    finally:
        driver.quit()
        engine.dispose()
