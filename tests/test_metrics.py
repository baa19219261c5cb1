"""Metrics render in the Prometheus text format and are served on a port."""

from __future__ import annotations

import urllib.request

from veil.metrics import Metrics


def test_render_and_serve() -> None:
    m = Metrics("leader")
    m.reports_received.labels(task="t1").inc(3)
    m.reports_rejected.labels(task="t1", reason="replayed").inc()
    m.track_storage(lambda: 4096.0)
    text = m.render().decode()
    assert 'veil_reports_received_total{task="t1"} 3.0' in text
    assert 'veil_reports_rejected_total{reason="replayed",task="t1"} 1.0' in text
    assert "veil_storage_bytes 4096.0" in text
    port = m.serve("127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        assert 'veil_reports_received_total{task="t1"} 3.0' in body
    finally:
        m.stop()


def test_registries_are_per_server() -> None:
    a, b = Metrics("leader"), Metrics("helper")
    a.hpke_opens.labels(outcome="ok").inc()
    assert "veil_hpke_opens_total" in a.render().decode()
    assert 'outcome="ok"' not in b.render().decode()
