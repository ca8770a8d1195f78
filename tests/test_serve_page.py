"""The chat page `edgellm serve` serves at / in a real headless browser (Debian's chromium + chromedriver, driven by
selenium): it loads, sends a message, shows the streamed reply (the same text the API gives) and its speed line, and
a second message continues the conversation from the slot's cache. The screenshot is kept with the test's files
($EDGELLM_TEST_ARTEFACTS, else the test's tmp dir)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

webdriver = pytest.importorskip("selenium.webdriver")
pytest.importorskip("tvm")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from edgellm.runtime.python.api import Runtime  # noqa: E402

from test_serve import start_server, stop_server  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="no chromium / chromedriver (apt-get install chromium chromium-driver)")


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=900,700"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield d
    d.quit()


def test_page_sends_and_streams(browser, tmp_path, demo_q8):
    pkg = demo_q8
    p, url = start_server(pkg, "--parallel", "2", "--name", "demo")
    try:
        browser.get(url + "/")
        assert "edgellm" in browser.title
        assert "demo" in browser.find_element(By.ID, "model").text
        hello = browser.find_element(By.ID, "welcome").text   # the first open says what this is and what to do
        assert "demo" in hello and "context" in hello and "Type a message" in hello
        first = Path(os.environ.get("EDGELLM_TEST_ARTEFACTS", tmp_path)) / "serve_chat_page_first_open.png"
        first.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(first))
        browser.find_element(By.TAG_NAME, "summary").click()
        browser.find_element(By.ID, "temperature").send_keys("0")
        mt = browser.find_element(By.ID, "max_tokens")
        mt.clear()
        mt.send_keys("24")
        replies = []
        for i, msg in enumerate(["Write a function that adds two numbers", "Now make it multiply"]):
            box = browser.find_element(By.ID, "input")
            box.send_keys(msg)
            browser.find_element(By.ID, "send").click()
            WebDriverWait(browser, 30).until(
                lambda d, n=i + 1: len(d.find_elements(By.CSS_SELECTOR, ".assistant[data-done='1']")) == n)
            replies.append(browser.find_elements(By.CSS_SELECTOR, ".assistant")[-1].get_attribute("textContent"))
            assert browser.find_elements(By.CSS_SELECTOR, ".user")[-1].text == msg
            assert not browser.find_elements(By.CSS_SELECTOR, ".error")
        assert not browser.find_elements(By.ID, "welcome")   # gone with the first message
        stats = browser.find_element(By.ID, "stats").text
        assert "prefill" in stats and "decode" in stats and "cached" in stats
        assert int(stats.split("(")[1].split(" cached")[0]) > 0   # the second turn came from the slot's cache
        shot = Path(os.environ.get("EDGELLM_TEST_ARTEFACTS", tmp_path)) / "serve_chat_page.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
    finally:
        stop_server(p)
    # what the page showed is what the API gives for the same conversation
    with Runtime.load(pkg, threads=1) as rt:
        m = [{"role": "user", "content": "Write a function that adds two numbers"}]
        first = rt.new_context().chat(m, max_new_tokens=24, temperature=0)
        assert replies[0] == first.text
        m += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Now make it multiply"}]
        assert replies[1] == rt.new_context().chat(m, max_new_tokens=24, temperature=0).text
