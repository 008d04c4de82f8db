"""The web chat page at `/` (api/routes/ui.py, api/static/): served as llama-server serves its UI,
and driven in a real headless browser (Debian's chromium + chromium-driver, installed by .ci/run)
against a real tritium server on a tiny model."""
from __future__ import annotations

import json
import shutil
import time

import httpx
import pytest

KEY = "ui-test-key"


# ---- HTTP side (in-process) ------------------------------------------------------------------

def test_page_and_assets_served(api_engine, api_client):
    c = api_client(api_engine, api_keys=[KEY])
    r = c.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-cache" and r.headers["cross-origin-opener-policy"] == "same-origin"
    assert '<script src="app.js">' in r.text and "http" not in r.text.replace("http-equiv", "")  # no CDN
    assert c.get("/index.html").content == r.content
    js = c.get("/app.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("application/javascript")
    assert "innerHTML" not in js.text and "insertAdjacentHTML" not in js.text and "eval(" not in js.text
    assert c.get("/style.css").headers["content-type"].startswith("text/css")
    # the page is public, the API is not
    assert c.get("/v1/models").status_code == 401
    # revalidation
    assert c.get("/app.js", headers={"If-None-Match": js.headers["etag"]}).status_code == 304
    assert api_client(api_engine).get("/sw.js").status_code == 404  # a UI is served: no remover
    assert c.get("/props", headers={"Authorization": "Bearer " + KEY}).json()["ui"] is True


def test_no_ui(api_engine, api_client):
    c = api_client(api_engine, ui=False)
    r = c.get("/")
    assert r.status_code == 404 and r.json()["error"]["message"] == "File Not Found"
    assert c.get("/app.js").status_code == 404
    sw = c.get("/sw.js")
    assert sw.status_code == 200 and "unregister" in sw.text
    assert c.get("/props").json()["ui"] is False


def test_page_served_while_loading():
    from fastapi.testclient import TestClient

    from api.server import ServerConfig, create_app

    c = TestClient(create_app(ServerConfig(), None), raise_server_exceptions=False)  # never set ready
    assert c.get("/").status_code == 200
    assert c.get("/v1/models").status_code == 503


def test_cli_flags():
    from api.cli import build_parser, server_config

    for argv, ui in (([], True), (["--no-ui"], False), (["--no-webui"], False), (["--no-ui", "--webui"], True)):
        assert server_config(build_parser().parse_args(argv)).ui is ui


# ---- in a browser ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ui_server(start_server, tmp_path_factory):
    from runtime.model.tiny_model import spec_with, write_tiny_model

    path = tmp_path_factory.mktemp("ui") / "ui-tiny.gguf"
    write_tiny_model(path, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=4096,
                                     name="ui-tiny", seed=7), vocab="builtin")
    # --ignore-eos: the random model would otherwise stop at a random end-of-generation token
    return start_server("-m", str(path), "-c", "4096", "-np", "1", "--ignore-eos", "--api-key", KEY,
                        "--no-warmup")


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    assert binary and driver_path, "the browser test needs Debian's chromium and chromium-driver (see .ci/run)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1200,800"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(driver_path), options=opts)
    yield d
    d.quit()


def wait_for(cond, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def set_settings(d, *, max_tokens=None, system=None, temperature=None):
    d.find_element("id", "open-settings").click()
    for field, value in (("set-max-tokens", max_tokens), ("set-system", system), ("set-temperature", temperature)):
        if value is not None:
            e = d.find_element("id", field)
            e.clear()
            e.send_keys(str(value))
    d.find_element("id", "settings-save").click()
    wait_for(lambda: not d.find_element("id", "settings").get_attribute("open"), 5, "the settings to close")


LAST = """const ms = document.querySelectorAll('#messages .msg.assistant');
const m = ms[ms.length - 1];
if (!m) return null;
const t = m.querySelector('.tokens'), c = m.querySelector('.content');
return {n: ms.length, state: m.dataset.state, text: c ? c.textContent : '', tokens: t ? t.textContent : ''};"""


def last_answer(d) -> dict | None:
    """The last assistant message, read in one script (the page re-renders while it streams)."""
    return d.execute_script(LAST)


def send(d, text):
    box = d.find_element("id", "input")
    box.send_keys(text)
    d.find_element("id", "send").click()


def test_chat_in_browser(ui_server, browser, tmp_path):
    d = browser
    d.get(ui_server.url + "/")
    # /v1/models answers 401: the page asks for the key
    dialog = d.find_element("id", "api-key-dialog")
    wait_for(lambda: dialog.get_attribute("open") is not None, 20, "the API key dialog")
    d.find_element("id", "api-key-input").send_keys(KEY)
    d.find_element("id", "api-key-save").click()
    wait_for(lambda: d.find_element("id", "model-name").text == "ui-tiny.gguf", 20, "the model name")

    # a short answer: exactly max_tokens tokens come back (the server ignores EOS)
    set_settings(d, max_tokens=3, temperature=0)
    send(d, "Hello there")
    a = wait_for(lambda: (x := last_answer(d)) and x["state"] == "done" and x, 120, "an answer")
    assert a["tokens"].startswith("3 tokens") and a["text"].strip()
    first_answer = a["text"]

    # a long one: text arrives while it streams, then Stop ends it
    set_settings(d, max_tokens=-1)
    send(d, "Tell me a long story")
    lengths = []

    def streaming_text():
        x = last_answer(d)
        if not x or x["n"] != 2 or x["state"] != "streaming":
            return False
        n = len(x["text"])
        if n and (not lengths or n != lengths[-1]):
            lengths.append(n)
        return len(lengths) >= 3
    wait_for(streaming_text, 120, "streamed text")
    assert lengths == sorted(lengths)  # it grew piece by piece
    assert d.find_element("id", "send").get_attribute("hidden") is not None
    d.find_element("id", "stop").click()
    wait_for(lambda: last_answer(d)["state"] == "stopped", 10, "the stop")
    stopped_text = last_answer(d)["text"]
    assert len(stopped_text) >= lengths[-1]
    assert d.find_element("id", "stop").get_attribute("hidden") is not None
    # the server stops generating too (the closed stream cancels the task)
    h = {"Authorization": "Bearer " + KEY}
    wait_for(lambda: not any(s["is_processing"] for s in httpx.get(ui_server.url + "/slots", headers=h).json()),
             10, "the slot to go idle")
    time.sleep(0.5)
    assert last_answer(d)["text"] == stopped_text

    # regenerate replaces the last answer
    set_settings(d, max_tokens=4)
    d.find_element("css selector", "#messages .msg.assistant:last-child .regenerate").click()
    a = wait_for(lambda: (x := last_answer(d)) and x["state"] == "done" and x, 120, "the regenerated answer")
    assert a["n"] == 2 and a["tokens"].startswith("4 tokens")
    assert len(d.find_elements("css selector", "#messages .msg")) == 4
    d.save_screenshot(str(tmp_path / "chat.png"))
    assert (tmp_path / "chat.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a new conversation; both are kept in localStorage across a reload
    d.find_element("id", "new-chat").click()
    assert d.find_elements("css selector", "#messages .msg") == []
    d.refresh()
    items = wait_for(lambda: d.find_elements("css selector", "#conversations li"), 10, "the conversation list")
    assert len(items) == 2
    items[1].click()
    msgs = d.find_elements("css selector", "#messages .msg")
    assert len(msgs) == 4 and msgs[1].find_element("css selector", ".content").text == first_answer.strip()
    assert json.loads(d.execute_script("return localStorage.getItem('tritium.settings')"))["max_tokens"] == 4


def test_model_text_is_never_html(ui_server, browser):
    """Markdown renders as elements; HTML in model text stays text; reasoning is folded."""
    d = browser
    d.get(ui_server.url + "/")
    content = ("# Title\n\nSome **bold** and `x<y>` code <img src=x onerror=\"window.__pwned=1\">\n\n"
               "```python\nprint('<b>hi</b>')\n```\n\n- one\n- [link](javascript:window.__pwned=2)\n"
               "- [site](https://example.com)\n\n<script>window.__pwned=3</script>")
    conv = {"id": "xss", "title": "xss", "messages": [
        {"role": "user", "content": "<i>user html</i>"},
        {"role": "assistant", "content": content, "reasoning": "thinking <b>hard</b>", "state": "done",
         "tool_calls": [{"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"<Paris>\"}"}}]}]}
    d.execute_script("localStorage.setItem('tritium.conversations', arguments[0])", json.dumps([conv]))
    d.refresh()
    box = wait_for(lambda: d.find_elements("css selector", "#messages .msg.assistant"), 10, "the message")[0]
    assert d.execute_script("return window.__pwned") is None
    assert d.find_elements("css selector", "#messages img, #messages script, #messages i, #messages b") == []
    assert box.find_element("css selector", "h2").text == "Title"
    assert box.find_element("css selector", "strong").text == "bold"
    assert [c.text for c in box.find_elements("css selector", "code")] == ["x<y>", "print('<b>hi</b>')"]
    assert box.find_element("css selector", "pre code").get_attribute("data-lang") == "python"
    assert '<img src=x onerror="window.__pwned=1">' in box.text and "<script>window.__pwned=3</script>" in box.text
    links = box.find_elements("css selector", "a")
    assert [a.get_attribute("href") for a in links] == ["https://example.com/"]
    assert len(box.find_elements("css selector", "li")) == 3
    details = box.find_element("css selector", "details")
    assert details.get_attribute("open") is None  # folded
    assert details.find_element("css selector", ".reasoning").get_attribute("textContent") == "thinking <b>hard</b>"
    assert box.find_element("css selector", ".tool-call").text == 'tool call: get_weather({"city":"<Paris>"})'
    assert d.find_element("css selector", "#messages .msg.user").text.endswith("<i>user html</i>")


# ---- images (a server with --mmproj) ----------------------------------------------------------------

@pytest.fixture(scope="module")
def vision_server(start_server, tmp_path_factory):
    from runtime.vision.tiny_mmproj import write_pair

    model, mmproj = write_pair(tmp_path_factory.mktemp("ui-vision"), "qwen25vl")
    return start_server("-m", str(model), "--mmproj", str(mmproj), "-c", "2048", "-np", "1", "--ignore-eos",
                        "--no-warmup")


# a File in a DataTransfer, pasted into the text box or dropped on the composer (what a browser
# hands the page when an image is pasted from the clipboard or dragged from the desktop)
GIVE = """const [how, b64, name] = arguments;
const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
const dt = new DataTransfer();
dt.items.add(new File([bytes], name, {type: "image/png"}));
if (how === "paste") document.getElementById('input').dispatchEvent(new ClipboardEvent('paste', {clipboardData: dt, bubbles: true, cancelable: true}));
else document.getElementById('composer').dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));"""
SPY = """window.__bodies = [];
const f = window.fetch;
window.fetch = (u, o) => { if (o && o.body) window.__bodies.push(String(o.body)); return f(u, o); };"""


def test_images_in_browser(vision_server, browser):
    import base64
    import io

    import numpy as np
    from PIL import Image

    d = browser
    d.get(vision_server.url + "/")
    wait_for(lambda: d.find_element("id", "model-name").text == "tiny-qwen25vl-model.gguf", 20, "the model name")
    wait_for(lambda: d.find_element("id", "attach").get_attribute("hidden") is None, 10, "the attach button")
    d.execute_script(SPY)
    b = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(b, "PNG")
    png = base64.b64encode(b.getvalue()).decode()
    set_settings(d, max_tokens=3, temperature=0)

    d.execute_script(GIVE, "paste", png, "pasted.png")
    d.execute_script(GIVE, "drop", png, "dropped.png")
    thumbs = wait_for(lambda: d.find_elements("css selector", "#attachments img") if len(
        d.find_elements("css selector", "#attachments img")) == 2 else None, 10, "two thumbnails")
    assert all(t.get_attribute("src").startswith("data:image/png;base64,") for t in thumbs)
    d.find_elements("css selector", "#attachments .remove")[1].click()  # the dropped one goes again
    assert len(d.find_elements("css selector", "#attachments img")) == 1
    send(d, "What is this?")
    a = wait_for(lambda: (x := last_answer(d)) and x["state"] == "done" and x, 120, "an answer about the image")
    assert a["tokens"].startswith("3 tokens") and not d.find_elements("css selector", "#messages .error")
    body = json.loads(d.execute_script("return window.__bodies.filter((b) => b.includes('messages')).pop()"))
    parts = body["messages"][-1]["content"]
    assert parts == [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + png}},
                     {"type": "text", "text": "What is this?"}]
    # the message shows its image; the attachment row is empty again; an image alone can be sent
    assert d.find_element("css selector", "#messages .msg.user img.media").get_attribute("src").endswith(png[-16:])
    assert d.find_element("id", "attachments").get_attribute("hidden") is not None
    d.execute_script(GIVE, "paste", png, "again.png")
    wait_for(lambda: d.find_elements("css selector", "#attachments img"), 10, "the thumbnail")
    d.find_element("id", "send").click()
    wait_for(lambda: (x := last_answer(d)) and x["n"] == 2 and x["state"] == "done", 120, "the second answer")


def test_no_attachments_without_mmproj(ui_server, browser):
    d = browser
    d.get(ui_server.url + "/")
    d.execute_script("localStorage.setItem('tritium.apiKey', arguments[0])", KEY)
    d.refresh()
    wait_for(lambda: d.find_element("id", "model-name").text == "ui-tiny.gguf", 20, "the model name")
    time.sleep(0.5)
    assert d.find_element("id", "attach").get_attribute("hidden") is not None
    d.execute_script(GIVE, "paste", "iVBORw0KGgo=", "x.png")
    assert d.find_elements("css selector", "#attachments img") == []
