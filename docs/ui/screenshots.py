"""Take the README's screenshots of every page with headless Chromium, on a store that the collector filled from
`tracemill simulate`: 100 episodes a day for six days, the first three under harness prompt-v1, the last three under
prompt-v2. Run from the repository root:

    .venv/bin/python docs/ui/screenshots.py      # writes docs/ui/*.png
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tracemill.simulate import simulate
from tracemill.store.engine import make_engine
from tracemill.ui import users
from tracemill.ui.access import Role

from support import CollectorProcess, UIProcess, chromium

OUT = Path(__file__).resolve().parent
PASSWORD = "screenshots only"
DAYS = 6
DAY_NS = 86_400 * 1_000_000_000


def _settle(driver, seconds: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    time.sleep(seconds)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and driver.find_elements(By.CSS_SELECTOR, "[data-testid='stStatusWidget']"):
        time.sleep(0.3)


def _page(driver, title: str) -> None:  # type: ignore[no-untyped-def]
    next(a for a in driver.find_elements(By.CSS_SELECTOR, "[data-testid='stSidebarNavLink']")
         if a.text.strip().endswith(title)).click()
    _settle(driver)


def _shot(driver, name: str, height: int | None = None) -> None:  # type: ignore[no-untyped-def]
    full = driver.execute_script("return document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    driver.set_window_size(1440, min(max(900, (height or full) + 40), 2600))
    _settle(driver, 1.5)
    driver.save_screenshot(str(OUT / f"{name}.png"))
    print("wrote", OUT / f"{name}.png")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="tracemill-shots-"))
    url = f"sqlite:///{work / 'tracemill.db'}"
    collector = CollectorProcess(url, work).start()
    try:
        for day in range(DAYS):  # the first half of the days under prompt-v1, then prompt-v2
            start = time.time_ns() - (DAYS - day) * DAY_NS
            if day < DAYS // 2:
                simulate(collector.url, traces=100, seed=day, harness_version="prompt-v1", start_ns=start)
            else:
                simulate(collector.url, traces=100, seed=day, profile="qwen3", harness_version="prompt-v2",
                         start_ns=start)
    finally:
        collector.stop()
    engine = make_engine(url)
    users.add_user(engine, "rita", Role.REVIEWER, PASSWORD)
    engine.dispose()
    ui = UIProcess(url, work).start()
    driver = chromium(work / "profile")
    try:
        driver.get(ui.url)
        _settle(driver)
        _shot(driver, "sign-in", 700)
        driver.find_element(By.CSS_SELECTOR, "input[aria-label='Name']").send_keys("rita")
        driver.find_element(By.CSS_SELECTOR, "input[type='password']").send_keys(PASSWORD, Keys.ENTER)
        _settle(driver, 5)
        _shot(driver, "traces")
        box = next(b for b in driver.find_elements(By.CSS_SELECTOR, "[data-testid='stSelectbox']")
                   if b.text.startswith("Open trace"))
        box.find_element(By.TAG_NAME, "input").click()
        time.sleep(1)
        options = driver.find_elements(By.CSS_SELECTOR, "[role='option']")
        next(o for o in options if not o.text.endswith(" 0 failed")).click()
        _settle(driver, 5)
        driver.execute_script("document.querySelector('[data-testid=\"stMain\"]').scrollTo(0, 640)")
        _shot(driver, "trace")
        for title, name in (("Failure modes", "failure-modes"), ("Review queue", "review-queue"),
                            ("Datasets", "datasets"), ("Models and deployments", "models")):
            driver.set_window_size(1440, 900)
            _page(driver, title)
            _shot(driver, name)
    finally:
        driver.quit()
        ui.stop()


if __name__ == "__main__":
    main()
