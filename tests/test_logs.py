"""Log formats, levels and the secret filter."""

from __future__ import annotations

import io
import json
import logging

import pytest

from veil.logs import configure_logging, resolve_level


def test_json_lines_carry_context_and_drop_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VEIL_LOG_LEVEL", raising=False)
    out = io.StringIO()
    configure_logging("debug", json_lines=True, stream=out)
    log = logging.getLogger("veil.test")
    log.info(
        "job done",
        extra={
            "task_id": "abc",
            "job_id": "j1",
            "verify_key": "SECRET",
            "key_id": 3,
            "input_share": "SECRET",
            "auth_token": "SECRET",
        },
    )
    entry = json.loads(out.getvalue().splitlines()[-1])
    assert entry["message"] == "job done"
    assert entry["level"] == "info"
    assert (entry["task_id"], entry["job_id"], entry["key_id"]) == ("abc", "j1", 3)
    assert "SECRET" not in out.getvalue()


def test_level_from_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VEIL_LOG_LEVEL", "warning")
    assert resolve_level("debug") == logging.WARNING
    monkeypatch.delenv("VEIL_LOG_LEVEL")
    assert resolve_level("debug") == logging.DEBUG
    assert resolve_level(None) == logging.INFO
    with pytest.raises(ValueError, match="unknown log level"):
        resolve_level("loud")


def test_text_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VEIL_LOG_LEVEL", raising=False)
    out = io.StringIO()
    configure_logging("info", stream=out)
    logging.getLogger("veil.x").warning("careful", extra={"task_id": "t"})
    logging.getLogger("veil.x").debug("hidden")
    text = out.getvalue()
    assert "careful" in text and "task_id=t" in text and "hidden" not in text
