"""Running the JavaScript client (js/) from the Python tests.

The JS client's own tests run under node (`npm test` in js/); these helpers
let pytest drive it to build reports that real veil servers then open, verify
and aggregate. Where node or js/node_modules is missing the tests skip, saying
how to get them; under CI they fail instead, so CI never passes without them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.modes import unavailable
from veil.client import Report
from veil.hpke import Ciphertext, HpkeConfig
from veil.task import Task, b64d, b64e

JS_DIR = Path(__file__).resolve().parents[2] / "js"


def require_node_client() -> str:
    """The path of node, once the JS client's dependencies are installed."""
    node = shutil.which("node")
    if node is None:
        reason = "node not found: install Node.js >= 20 to test the JavaScript client"
    elif not (JS_DIR / "node_modules").is_dir():
        reason = "js/node_modules missing: run `npm ci` in js/"
    else:
        return node
    unavailable(reason)


def config_json(config: HpkeConfig) -> dict[str, Any]:
    return {
        "config_id": config.config_id,
        "kem_id": config.kem_id,
        "kdf_id": config.kdf_id,
        "aead_id": config.aead_id,
        "public_key": b64e(config.public_key),
    }


def task_json(task: Task) -> dict[str, Any]:
    """What the JS client knows of a task (the public survey description's part)."""
    d: dict[str, Any] = {
        "task_id": b64e(task.task_id),
        "vdaf": task.vdaf.to_dict(),
        "time_precision": task.time_precision,
    }
    if task.dp.local_epsilon is not None:
        dp = task.dp.to_dict()
        d["dp"] = {k: dp[k] for k in ("local_epsilon", "local_max_choices") if k in dp}
    return d


def _ciphertext(d: dict[str, Any]) -> Ciphertext:
    return Ciphertext(int(d["config_id"]), b64d(d["enc"]), b64d(d["payload"]))


def report_from_json(d: dict[str, Any]) -> Report:
    return Report(
        b64d(d["report_id"]),
        int(d["time"]),
        b64d(d["public_share"]),
        _ciphertext(d["leader_encrypted_input_share"]),
        _ciphertext(d["helper_encrypted_input_share"]),
        b64d(d["token"]) if "token" in d else b"",
    )


def js_reports(
    task: Task,
    leader: HpkeConfig,
    helper: HpkeConfig,
    measurements: Sequence[Any],
    report_time: int,
) -> list[Report | str]:
    """One entry per measurement: the report the JS client built, or the
    message with which it refused the measurement."""
    node = require_node_client()
    request = {
        "task": task_json(task),
        "leader": config_json(leader),
        "helper": config_json(helper),
        "measurements": list(measurements),
        "time": report_time,
    }
    done = subprocess.run(
        [node, str(JS_DIR / "scripts" / "reports.mjs")],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    out: list[Report | str] = []
    for line in done.stdout.decode().splitlines():
        item = json.loads(line)
        out.append(item["error"] if "error" in item else report_from_json(item["report"]))
    assert len(out) == len(measurements)
    return out


def js_dap_reports(
    task: Task,
    leader: HpkeConfig,
    helper: HpkeConfig,
    measurements: Sequence[Any],
    report_time: int,
    version: str | None = None,
) -> list[bytes | str]:
    """One entry per measurement of a DAP task: the encoded DAP Report the
    JS client built (js/src/dap.js), or the message with which it refused the
    measurement. `version` overrides the task's draft (a wrong one seals
    shares the aggregators cannot open)."""
    node = require_node_client()
    assert task.dap is not None
    configuration = task.dap_configuration().encode(task.dap.dap_version)
    request = {
        "task": task_json(task),
        "leader": config_json(leader),
        "helper": config_json(helper),
        "dap": {"version": version or task.dap.version, "configuration": b64e(configuration)},
        "measurements": list(measurements),
        "time": report_time,
    }
    done = subprocess.run(
        [node, str(JS_DIR / "scripts" / "dap-reports.mjs")],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    out: list[bytes | str] = []
    for line in done.stdout.decode().splitlines():
        item = json.loads(line)
        out.append(item["error"] if "error" in item else b64d(item["report"]))
    assert len(out) == len(measurements)
    return out
