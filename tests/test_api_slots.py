"""Slot routes in process (`/slots`, `POST /slots/{id}?action=...`) on the real engine (conftest's
`api_engine`), and the runtime's slot file name check, which follows llama.cpp's
fs_validate_filename."""
from __future__ import annotations

import pytest

from runtime.serving import valid_slot_filename


def error(message: str, code: int = 400, type: str = "invalid_request_error") -> str:
    return f'{{"error":{{"code":{code},"message":"{message}","type":"{type}"}}}}'


def test_slot_actions_need_a_save_path(api_engine, api_client):
    with api_client(api_engine) as c:
        for action in ("save", "restore", "erase"):
            r = c.post(f"/slots/0?action={action}", json={"filename": "a.bin"})
            assert (r.status_code, r.text) == (501, error(
                "This server does not support slots action. Start it with `--slot-save-path`", 501,
                "not_supported_error"))


def test_slot_save_erase_restore_and_errors(api_engine, api_client):
    with api_client(api_engine, slot_save_path=api_engine.cfg.slot_save_path) as c:
        c.post("/completion", json={"prompt": "hello there", "n_predict": 1, "temperature": 0, "id_slot": 0})
        saved = c.post("/slots/0?action=save", json={"filename": "s.bin"}).json()
        assert saved["id_slot"] == 0 and saved["filename"] == "s.bin" and saved["n_saved"] > 0
        assert c.post("/slots/0?action=erase").json() == {"id_slot": 0, "n_erased": saved["n_saved"]}
        restored = c.post("/slots/0?action=restore", json={"filename": "s.bin"}).json()
        assert (restored["n_restored"], restored["n_read"]) == (saved["n_saved"], saved["n_written"])
        slots = c.get("/slots").json()
        assert [s["id"] for s in slots] == [0, 1] and list(slots[0])[-2:] == ["params", "next_token"]

        cases = [("/slots/0?action=restore", {"filename": "../etc/passwd"}, "Invalid filename"),
                 ("/slots/9?action=save", {"filename": "a/b"}, "Invalid filename"),  # before the slot id
                 ("/slots/0?action=save", {}, "Invalid filename"),
                 ("/slots/x?action=erase", None, "Invalid slot ID"),
                 ("/slots/9?action=erase", None, "Invalid slot ID"),  # the engine's SlotError
                 ("/slots/0?action=restore", {"filename": "missing.bin"}, "failed to restore slot"),
                 ("/slots/0?action=zap", None, "Invalid action"),
                 ("/slots/0", None, "Invalid action")]
        for path, body, message in cases:
            r = c.post(path, json=body)
            assert (r.status_code, r.text) == (400, error(message)), path


def test_fail_on_no_slot(api_engine, api_client):
    with api_client(api_engine) as c:
        assert c.get("/slots?fail_on_no_slot=1").status_code == 200  # idle engine
    with api_client(api_engine, slots=False) as c:
        r = c.get("/slots")
        assert (r.status_code, r.text) == (501, error(
            "This server does not support slots endpoint. Start it with `--slots`", 501, "not_supported_error"))


@pytest.mark.parametrize("name", ["a.bin", "review-prefix2.bin", ".hidden", "a b", "x.y.z", "caf\u00e9",
                                  "\u00a0a\u00a0", "a" * 255, "\u00e9" * 127, "\U0001f600"])
def test_valid_slot_filenames(name):
    assert valid_slot_filename(name)


@pytest.mark.parametrize("name", ["", ".", "..", "a..b", "../etc/passwd", "a/b", "a\\b", "c:x", "a*", "a?", 'a"',
                                  "a<", "a>", "a|", " a", "a ", "a.", "a\x00", "a\n", "a\x1f", "a\x7f", "a\x85",
                                  "a\u2215b", "a\u2216b", "a\uff0eb", "a\ufffd", "\ufeffa", "a\ud800", "a" * 256,
                                  "\u00e9" * 128])
def test_invalid_slot_filenames(name):
    assert not valid_slot_filename(name)
