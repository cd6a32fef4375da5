"""The chat page in a real browser: Debian's headless Chromium, driven by
Selenium through Debian's chromedriver, against one ``oxillama serve``
process (with ``--api-key`` and a sessions folder) that the restart test
stops and starts again.

The tests send a message and watch the reply stream in; stop replies
(the Stop button and Escape); fork from the first answer and continue the
fork exactly; reload and find the sessions listed; restart the server and
continue a saved session exactly; enter the API key; and check the 375 px
layout and dark mode. They take the screenshots of the docs
(``docs/img/webui-*.png``): into that folder when ``OXILLAMA_DOC_SCREENSHOTS=1``
is set, into a temporary folder otherwise, so a test run leaves the working
tree as it found it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from oxillama.sessions import info as snapshot_info

KEY = "sk-webui-test"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DOC_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """One ``oxillama serve`` process; ``restart`` stops it (SIGTERM: a
    graceful drain) and starts a new one on the same port and folder."""

    def __init__(self, folder: Path, log: Path) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = folder
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        cmd = [sys.executable, "-m", "oxillama", "serve", "--port", str(self.port)]
        cmd += ["--threads", "2", "--context-size", "1024", "--max-batch", "2"]
        cmd += ["--sessions-dir", str(self.folder), "--api-key", KEY]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise AssertionError("the server did not start: " + self.log.read_text()[-2000:])

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0

    def restart(self) -> None:
        self.stop()
        self.start()

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {KEY}"}
        r = httpx.request(method, self.url + path, headers=headers, timeout=120, **kwargs)
        assert r.status_code == 200, r.text
        return r


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("webui")
    s = Served(tmp / "sessions", tmp / "server.log")
    yield s
    if s.proc is not None and s.proc.poll() is None:
        s.proc.send_signal(signal.SIGTERM)
        s.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--mute-audio"):
        options.add_argument(arg)
    options.add_argument("--window-size=1200,800")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver is Debian's, named explicitly: Selenium never fetches one.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def wait(driver: WebDriver, cond: Callable[[WebDriver], Any], timeout: float = 60) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.02).until(cond)


def ready(driver: WebDriver) -> None:
    wait(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "true")


@pytest.fixture
def page(browser: WebDriver, served: Served) -> WebDriver:
    """The page with the key already in this tab's session storage (the
    key test enters it through the page itself, in a tab of its own)."""
    browser.set_window_size(1200, 800)
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    browser.get(served.url + "/openapi.json")
    browser.execute_script("sessionStorage.setItem('oxillama-api-key', arguments[0])", KEY)
    browser.get(served.url + "/")
    ready(browser)
    return browser


def by_name(driver: WebDriver, role: str, name: str) -> list[WebElement]:
    """The elements with this ARIA role and accessible name, as the
    browser computes them (read again if the page redraws meanwhile)."""
    tags = {"button": "button", "textbox": "textarea, input", "list": "ul, ol"}[role]
    for _ in range(20):
        try:
            return [
                e
                for e in driver.find_elements(By.CSS_SELECTOR, tags)
                if e.aria_role == role and e.accessible_name == name
            ]
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError(f"the page kept changing while looking for {role} {name!r}")


def one(driver: WebDriver, role: str, name: str) -> WebElement:
    found = by_name(driver, role, name)
    assert len(found) == 1, (role, name, len(found))
    return found[0]


def current_id(driver: WebDriver) -> str:
    return str(driver.execute_script("return decodeURIComponent(location.hash.slice(1))"))


def set_field(driver: WebDriver, field: str, value: str) -> None:
    driver.execute_script(
        "const e = document.getElementById(arguments[0]);"
        "if (e.type === 'checkbox') e.checked = arguments[1] === 'true';"
        "else e.value = arguments[1];"
        "e.dispatchEvent(new Event('change'));",
        field,
        value,
    )


def settings(driver: WebDriver, **values: str) -> None:
    for k, v in values.items():
        set_field(driver, k, v)


def new_session(driver: WebDriver) -> str:
    before = current_id(driver)
    one(driver, "button", "New session").click()
    wait(driver, lambda d: current_id(d) != before)
    return current_id(driver)


def idle(driver: WebDriver) -> bool:
    return bool(
        driver.execute_script(
            "return document.getElementById('stop').disabled && "
            "!document.querySelector('.msg.streaming') && !document.body.dataset.busy"
        )
    )


def type_and_send(driver: WebDriver, text: str) -> None:
    box = one(driver, "textbox", "Message")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def send(driver: WebDriver, text: str) -> None:
    type_and_send(driver, text)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.streaming"), 30)
    wait(driver, idle)


def stored(served: Served, sid: str) -> dict[str, Any]:
    return dict(served.api("GET", f"/v1/sessions/{sid}").json())


def listed(driver: WebDriver) -> list[str]:
    items = one(driver, "list", "Sessions").find_elements(By.CSS_SELECTOR, "li")
    return [str(li.get_attribute("data-id")) for li in items]


def reference(served: Served, messages: list[dict[str, Any]], **sampling: Any) -> str:
    """What a stateless request with this history gives."""
    body = {"messages": [{"role": m["role"], "content": m["content"]} for m in messages]}
    r = served.api("POST", "/v1/chat/completions", json={**body, **sampling})
    return str(r.json()["choices"][0]["message"]["content"])


SAMPLING = {"temperature": 0.9, "top_p": 0.95, "max_tokens": 24, "seed": 11}


def page_settings(driver: WebDriver, sampling: dict[str, Any]) -> None:
    settings(driver, **{k: str(v) for k, v in sampling.items()})


# --------------------------------------------------------------------------


def test_controls_have_their_accessible_names(page: WebDriver) -> None:
    for role, name in [
        ("textbox", "Message"),
        ("button", "Send"),
        ("button", "Stop"),
        ("button", "New session"),
        ("button", "Save"),
        ("list", "Sessions"),
    ]:
        one(page, role, name)


def test_narrow_and_dark_layouts(page: WebDriver, served: Served, tmp_path: Path) -> None:
    IMG = DOC_IMG if os.environ.get("OXILLAMA_DOC_SCREENSHOTS") == "1" else tmp_path
    sid = new_session(page)
    page_settings(page, {**SAMPLING, "max_tokens": 120})
    send(page, "Show a Python function that reverses a string, in a code block.")
    assert page.find_elements(By.CSS_SELECTOR, ".msg.assistant .code .tok-keyword")
    IMG.mkdir(parents=True, exist_ok=True)
    page.save_screenshot(str(IMG / "webui-light.png"))
    page.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
    )
    dark = page.execute_script("return getComputedStyle(document.body).backgroundColor")
    assert dark == "rgb(21, 23, 27)", dark
    page.save_screenshot(str(IMG / "webui-dark.png"))
    page.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    page.set_window_size(375, 812)
    inner = page.execute_script("return window.innerWidth")
    assert inner <= 375
    # Nothing wider than the screen; the list sits behind a button.
    assert page.execute_script("return document.documentElement.scrollWidth") <= inner
    assert not page.find_element(By.ID, "sessions").is_displayed()
    for role, name in [("textbox", "Message"), ("button", "Send"), ("button", "Save")]:
        e = one(page, role, name)
        rect = e.rect
        assert e.is_displayed() and rect["x"] >= 0 and rect["x"] + rect["width"] <= inner, name
    page.save_screenshot(str(IMG / "webui-narrow.png"))
    for name in ("light", "dark", "narrow"):
        assert (IMG / f"webui-{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one(page, "button", "Show sessions").click()
    wait(page, lambda d: one(d, "list", "Sessions").is_displayed())
    wait(page, lambda d: one(d, "button", "New session").rect["x"] >= 0)
    page.find_element(By.CSS_SELECTOR, f'#sessions li[data-id="{sid}"] .pick').click()
    wait(page, lambda d: not d.find_element(By.ID, "sessions").is_displayed())
    type_and_send(page, "Thanks!")
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.streaming"), 30)
    wait(page, idle)
    assert stored(served, sid)["n_messages"] == 4


def test_a_reply_streams_in_with_markdown_and_speed(page: WebDriver, served: Served) -> None:
    sid = new_session(page)
    page_settings(page, {**SAMPLING, "max_tokens": 96})
    # Every change of the reply's text is recorded as it happens.
    page.execute_script(
        "window.__lengths = [];"
        "new MutationObserver(() => {"
        "  const m = document.querySelector('.msg.assistant.streaming .body');"
        "  if (m) window.__lengths.push(m.textContent.length);"
        "}).observe(document.getElementById('log'), "
        "{subtree: true, childList: true, characterData: true});"
    )
    send(page, "Explain what a Python list is, in a few sentences.")
    lengths = page.execute_script("return window.__lengths")
    partial = sorted({n for n in lengths if n > 0})
    # The reply appeared piece by piece, not all at once.
    assert len(partial) >= 3, lengths
    notes = stored(served, sid)
    reply = notes["messages"][-1]
    assert reply["role"] == "assistant" and reply["content"]
    # The page shows what the server streamed, as the same request gives it.
    expected = reference(served, notes["messages"][:-1], **{**SAMPLING, "max_tokens": 96})
    assert reply["content"] == expected
    info = page.find_element(By.ID, "info").text
    assert "tokens/s" in info and "KV f16" in info and "context 1024" in info, info
    assert f"used {notes['tokens']} / 1024" in info, info
    assert page.find_elements(By.CSS_SELECTOR, ".msg.assistant .body")
    for fork in by_name(page, "button", "Fork"):
        assert fork.is_displayed()


def test_stop_and_escape_stop_a_reply(page: WebDriver, served: Served) -> None:
    sid = new_session(page)
    page_settings(page, {**SAMPLING, "max_tokens": 900})
    for how in ("button", "escape"):
        type_and_send(page, "Write a very long story about a dragon and a knight.")
        wait(
            page,
            lambda d: (
                len(
                    d.execute_script(
                        "return (document.querySelector("
                        "'.msg.assistant.streaming .body') || {}).textContent || ''"
                    )
                )
                > 20
            ),
        )
        if how == "button":
            one(page, "button", "Stop").click()
        else:
            one(page, "textbox", "Message").send_keys(Keys.ESCAPE)
        wait(page, idle, 10)
        notes = wait(page, lambda d: stored(served, sid)["n_messages"] >= 2 and stored(served, sid))
        last = notes["messages"][-1]
        assert last["role"] == "assistant" and last.get("stopped") is True
        assert 0 < len(last["content"])
    # Stopped short of 900 tokens both times, and the session goes on.
    assert notes["tokens"] < 600
    assert len(page.find_elements(By.CSS_SELECTOR, ".msg .note")) == 2
    assert one(page, "button", "Send").is_enabled()


def test_fork_from_the_first_answer_continues_exactly(page: WebDriver, served: Served) -> None:
    sid = new_session(page)
    page_settings(page, SAMPLING)
    send(page, "Name a color.")
    send(page, "Name another one.")
    original = stored(served, sid)["messages"]
    # The first answer's Fork: a new session with the history up to it.
    forks = by_name(page, "button", "Fork")
    assert len(forks) == 4
    forks[1].click()
    wait(page, lambda d: current_id(d) != sid)
    fork = current_id(page)
    assert sid in listed(page) and fork in listed(page)
    assert stored(served, fork)["messages"] == original[:2]
    assert len(page.find_elements(By.CSS_SELECTOR, ".msg")) == 2
    send(page, "And a fruit?")
    got = stored(served, fork)["messages"]
    assert got[:2] == original[:2] and got[2]["content"] == "And a fruit?"
    # Exactly what the history up to there gives.
    assert got[3]["content"] == reference(served, got[:3], **SAMPLING)
    # The original is untouched.
    assert stored(served, sid)["messages"] == original


def test_sessions_are_listed_after_a_reload(page: WebDriver, served: Served) -> None:
    a = new_session(page)
    page_settings(page, SAMPLING)
    send(page, "Say hello.")
    b = new_session(page)
    page_settings(page, SAMPLING)
    send(page, "Say goodbye.")
    page.refresh()
    ready(page)
    wait(page, lambda d: {a, b} <= set(listed(d)))
    titles = one(page, "list", "Sessions").text
    assert "Say hello." in titles and "Say goodbye." in titles
    # The page comes back to the session it showed.
    assert current_id(page) == b
    page.find_element(By.CSS_SELECTOR, f'#sessions li[data-id="{a}"] .pick').click()
    wait(page, lambda d: current_id(d) == a)
    assert "Say hello." in page.find_element(By.ID, "log").text


def test_sessions_are_renamed_and_deleted_in_the_list(page: WebDriver, served: Served) -> None:
    sid = new_session(page)
    wait(page, lambda d: sid in listed(d))
    row = f'#sessions li[data-id="{sid}"]'
    page.find_element(By.CSS_SELECTOR, f"{row} button[aria-label^=Rename]").click()
    box = one(page, "textbox", "Session name")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("Groceries", Keys.ENTER)
    wait(page, lambda d: stored(served, sid)["title"] == "Groceries")
    wait(page, lambda d: d.find_element(By.ID, "session-title").text == "Groceries")
    page.find_element(By.CSS_SELECTOR, f"{row} button[aria-label='Delete Groceries']").click()
    page.switch_to.alert.accept()
    wait(page, lambda d: sid not in listed(d) and current_id(d) != sid)
    r = httpx.get(f"{served.url}/v1/sessions/{sid}", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 404


def test_json_schema_mode_constrains_the_reply(page: WebDriver, served: Served) -> None:
    sid = new_session(page)
    schema = {
        "type": "object",
        "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["color"],
    }
    page_settings(page, {**SAMPLING, "max_tokens": 30})
    settings(page, json_mode="true", json_schema=json.dumps(schema))
    send(page, "Pick a color.")
    reply = json.loads(stored(served, sid)["messages"][-1]["content"])
    assert reply["color"] in ("red", "green", "blue")
    # A schema the server cannot use: its own message, not a stall.
    settings(page, json_schema='{"type": "object", "properties": {"x": {"type": "nonsense"}}}')
    type_and_send(page, "Again.")
    alert = wait(page, lambda d: d.find_element(By.ID, "error").is_displayed() and d)
    text = alert.find_element(By.ID, "error-text").text
    assert "nonsense" in text, text
    assert one(page, "textbox", "Message").get_attribute("value") == "Again."
    settings(page, json_mode="false")


def test_reasoning_is_folded_and_output_is_never_html(page: WebDriver, served: Served) -> None:
    sid = "rendering"
    answer = (
        "# Plan\n\n<img src=x onerror=\"document.body.dataset.owned='1'\">\n\n"
        "- **bold** and `code`\n- [a link](javascript:alert(1))\n\n"
        "```python\ndef f(x):\n    return x + 1  # one more\n```\n"
    )
    messages = [
        {"role": "user", "content": "<b>hi</b>"},
        {"role": "assistant", "content": answer, "reasoning_content": "First I think."},
    ]
    served.api("PUT", f"/v1/sessions/{sid}", json={"title": "Rendering", "messages": messages})
    page.get(served.url + f"/#{sid}")
    page.refresh()
    ready(page)
    log = page.find_element(By.ID, "log")
    assert page.execute_script("return document.body.dataset.owned") is None
    assert not log.find_elements(By.CSS_SELECTOR, "img, b, script")
    assert '<img src=x onerror="document.body.dataset.owned=' in log.text
    assert "<b>hi</b>" in log.text
    # No link with a javascript: address; the text stays.
    assert not log.find_elements(By.CSS_SELECTOR, "a")
    assert log.find_element(By.CSS_SELECTOR, "h1").text == "Plan"
    assert log.find_element(By.CSS_SELECTOR, "li strong").text == "bold"
    code = log.find_element(By.CSS_SELECTOR, ".code pre code")
    assert code.find_element(By.CSS_SELECTOR, ".tok-keyword").text == "def"
    assert code.find_element(By.CSS_SELECTOR, ".tok-comment").text == "# one more"
    assert one(page, "button", "Copy code").is_displayed()
    details = log.find_element(By.CSS_SELECTOR, ".msg.assistant details.reasoning")
    thought = details.find_element(By.CSS_SELECTOR, ".text")
    assert details.get_attribute("open") is None and details.is_displayed()
    assert not thought.is_displayed()
    details.find_element(By.CSS_SELECTOR, "summary").click()
    assert thought.text == "First I think."


def test_export_and_import_a_snapshot(page: WebDriver, served: Served, tmp_path: Path) -> None:
    sid = new_session(page)
    page_settings(page, SAMPLING)
    send(page, "Name a tree.")
    one(page, "button", "Export").click()
    links = wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, "#exports a[download]"))
    assert [a.get_attribute("download") for a in links] == [
        "Name_a_tree..oxisnap",
        "Name_a_tree..oxisnap.chat.json",
    ]
    # Both files download as they are (the snapshot byte for byte).
    folder = tmp_path / "downloads"
    folder.mkdir()
    page.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(folder)}
    )
    for a in links:
        a.click()
    snap, chat = (folder / "Name_a_tree..oxisnap", folder / "Name_a_tree..oxisnap.chat.json")
    wait(page, lambda d: snap.is_file() and chat.is_file(), 20)
    notes = stored(served, sid)
    assert snapshot_info(snap).tokens_count == notes["tokens"]
    assert json.loads(chat.read_text())["messages"] == notes["messages"]
    # The pair imported: a new session with the same messages and state.
    (tmp_path / "tree.oxisnap").write_bytes(snap.read_bytes())
    (tmp_path / "tree.oxisnap.chat.json").write_bytes(chat.read_bytes())
    files = f"{tmp_path / 'tree.oxisnap'}\n{tmp_path / 'tree.oxisnap.chat.json'}"
    page.find_element(By.ID, "import").send_keys(files)
    wait(page, lambda d: current_id(d) not in (sid, ""))
    imported = stored(served, current_id(page))
    assert imported["messages"] == notes["messages"] and imported["title"] == "Name a tree."
    assert imported["live"] and imported["tokens"] == notes["tokens"]


def test_the_page_asks_for_the_key(browser: WebDriver, served: Served) -> None:
    main = browser.current_window_handle
    browser.switch_to.new_window("tab")  # a tab of its own: empty session storage
    try:
        browser.get(served.url + "/")
        dialog = wait(browser, lambda d: d.find_element(By.ID, "key-dialog").is_displayed() and d)
        key = dialog.find_element(By.ID, "key")
        key.send_keys("sk-wrong", Keys.ENTER)
        wait(browser, lambda d: "incorrect API key" in d.find_element(By.ID, "key-error").text)
        key = browser.find_element(By.ID, "key")
        key.send_keys(KEY, Keys.ENTER)
        ready(browser)
        assert "SmolLM2" in browser.find_element(By.ID, "info").text
        stored_key = browser.execute_script("return sessionStorage.getItem('oxillama-api-key')")
        assert stored_key == KEY
        # Nowhere else: not in local storage, not in a cookie.
        assert browser.execute_script("return localStorage.length") == 0
        assert browser.execute_script("return document.cookie") == ""
    finally:
        browser.close()
        browser.switch_to.window(main)


def test_a_saved_session_continues_exactly_after_a_restart(page: WebDriver, served: Served) -> None:
    sid = new_session(page)
    page_settings(page, SAMPLING)
    send(page, "Tell me about rivers.")
    one(page, "button", "Save").click()
    wait(page, lambda d: (served.folder / f"{sid}.oxisnap").is_file())
    before = stored(served, sid)["messages"]
    served.restart()
    page.refresh()
    ready(page)
    assert sid in listed(page) and current_id(page) == sid
    assert "Tell me about rivers." in page.find_element(By.ID, "log").text
    send(page, "And mountains?")
    after = stored(served, sid)["messages"]
    assert after[:2] == before and after[2]["content"] == "And mountains?"
    # The session came back from its snapshot, and gave exactly what the
    # history gives.
    metrics = served.api("GET", "/metrics").text
    assert 'oxillama:session_restores_total{reason="adopt"} 1.0' in metrics, metrics
    assert after[3]["content"] == reference(served, after[:3], **SAMPLING)
