"""Metrics render in the Prometheus text format and are served on a port."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

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


def test_metrics_listen_off_loopback_needs_public(tmp_path: Path) -> None:
    """Issue 13: the metrics listener (plain HTTP, no auth) bound any address.
    Off loopback it is now refused at start, naming the line, unless
    `public = true`; the worker's --metrics obeys the same rule."""
    from veil.aggregator.run.config import ConfigError, load_config
    from veil.aggregator.run.worker import AggregationWorker

    def config(body: str) -> Path:
        path = tmp_path / "leader.toml"
        path.write_text('listen = "127.0.0.1:1"\nstorage = "l.db"\n[metrics]\n' + body)
        return path

    for address in ("0.0.0.0:9101", "10.1.2.3:9101", "[::]:9101", "metrics.example:9101"):
        path = config(f'listen = "{address}"\n')
        with pytest.raises(ConfigError, match="refusing to serve metrics on") as e:
            load_config(path)
        assert str(e.value).startswith(f"{path}:4:")
    path = config('listen = "127.0.0.1:nope"\n')
    with pytest.raises(ConfigError, match="is not host:port"):
        load_config(path)
    for address in ("127.0.0.1:9101", "localhost:9101", "[::1]:9101"):
        assert load_config(config(f'listen = "{address}"\n')).metrics_listen == address
    public = load_config(config('listen = "0.0.0.0:9101"\npublic = true\n'))
    assert public.metrics_public and public.metrics_listen == "0.0.0.0:9101"
    plain = load_config(config(""))
    with pytest.raises(ConfigError, match=r"refusing to serve metrics on 0\.0\.0\.0:9102"):
        AggregationWorker(plain, "0.0.0.0:9102")
