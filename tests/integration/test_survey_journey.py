"""A survey run as its parties run it, each step a real `veil` process:
deploy (plaintext on loopback, and TLS with a CA per aggregator), the two
servers, respondents answering by label (a JSON Lines panel, a TOML file,
one person at a terminal), the survey closed once they are done, `veil
survey collect`, and the report opened in a real browser.

Each test's survey is open for an hour (time precision 2 s), and is closed
with `veil survey close` and a reload of both servers as soon as its
respondents have answered (tests/support/window.py): a window sized to fit
them closed under them on a busy machine (40 to 60 s at load 6 to 14), and
was waited out on a quiet one.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import random
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import veil
from tests.support.survey_toml import commute, remote, team
from tests.support.tls import write_ca, write_server_cert
from tests.support.window import LONG_WINDOW, close_survey
from veil.hpke import generate_keypair
from veil.local.launcher import ServerProcess, free_port
from veil.task import load_task, write_toml
from veil.times import format_time

pytestmark = pytest.mark.slow

TP = 2
QUESTIONS = (
    "\n"
    + remote()
    + "\n"
    + commute(120)
    + "\n"
    + team()
    + """
[[question]]
id = "tools"
text = "Which tools do you use daily?"
kind = "multi_choice"
options = ["email", "chat", "wiki", "video"]
max_choices = 2

[[question]]
id = "ratings"
text = "Rate workload and pay from 0 to 10."
kind = "vector"
length = 2
max = 10
labels = ["workload", "pay"]
"""
)
LABELS = {
    "remote": ["yes"],
    "commute": ["mean", "sum"],
    "team": ["engineering", "design", "sales"],
    "tools": ["email", "chat", "wiki", "video"],
    "ratings": ["workload", "pay"],
}
# Wide enough that the 13 intervals (5 questions, each simultaneous) all hold
# the truth but once in about 10^6 runs: the misses of the five questions add
# up to 5e-7 (at 0.99999 they came to 5e-5). The intervals come from the exact
# noise distribution.
CONFIDENCE = "0.9999999"


def panel(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "remote": rng.random() < 0.3,
            "commute": rng.randrange(0, 100),
            "team": rng.choice(["engineering", "engineering", "design", "sales"]),
            "tools": rng.sample(["email", "chat", "wiki", "video"], rng.randrange(0, 3)),
            "ratings": [rng.randrange(2, 9), rng.randrange(0, 6)],
        }
        for _ in range(n)
    ]


def truth(answers: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    n = len(answers)
    commute = sum(a["commute"] for a in answers)
    return {
        "remote": {"yes": sum(a["remote"] for a in answers)},
        "commute": {"mean": commute / n, "sum": commute},
        "team": {t: sum(a["team"] == t for a in answers) for t in LABELS["team"]},
        "tools": {t: sum(t in a["tools"] for a in answers) for t in LABELS["tools"]},
        "ratings": {
            label: sum(a["ratings"][i] for a in answers) / n
            for i, label in enumerate(LABELS["ratings"])
        },
    }


# --- certificates for the TLS deployment (one CA per aggregator) -------------


def issue(tls_dir: Path, role: str, out: Path) -> Path:
    """A CA for `role` (written to out/ROLE-ca.crt) and its server certificate
    for 127.0.0.1 in tls_dir/ROLE.crt and .key, as the deployment names them."""
    ca_path = out / f"{role}-ca.crt"
    ca_key, ca = write_ca(ca_path, f"{role} CA")
    write_server_cert(
        tls_dir / f"{role}.crt", tls_dir / f"{role}.key", "127.0.0.1", ca_key, ca.subject
    )
    return ca_path


@dataclass
class Deployed:
    root: Path
    dep: Path
    opens: int
    closes: int
    helper: ServerProcess
    leader: ServerProcess
    client_tls: list[str]
    collector_tls: list[str]
    helper_ca: bytes | None

    @property
    def client(self) -> Path:
        return self.dep / "client"

    @property
    def collector(self) -> Path:
        return self.dep / "collector"

    def collections(self) -> int:
        with sqlite3.connect(self.dep / "leader" / "leader.db") as db:
            count: int = db.execute("SELECT COUNT(*) FROM collections").fetchone()[0]
        return count

    def close(self) -> None:
        """Close the survey now, for every party (tests/support/window.py)."""
        self.closes = close_survey(self.dep, [self.helper, self.leader])


@pytest.fixture
def deploy(tmp_path: Path) -> Iterator[Any]:
    started: list[ServerProcess] = []

    def run(tls: bool, epsilon: str = "2", min_batch_size: int = 50) -> Deployed:
        opens = int(time.time()) // TP * TP
        closes = opens + LONG_WINDOW
        survey = tmp_path / "survey.toml"
        survey.write_text(
            f'[survey]\nname = "Journey"\nepsilon = {epsilon}\nmin_batch_size = {min_batch_size}\n'
            f'time_precision = {TP}\nopens = "{format_time(opens)}"\n'
            f'closes = "{format_time(closes)}"\n' + QUESTIONS
        )
        leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        out = veil(
            "survey", "deploy", "--survey", survey, "--out", tmp_path / "dep",
            "--leader", leader, "--helper", helper, *([] if tls else ["--no-tls"]),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        dep = tmp_path / "dep"
        client_tls: list[str] = []
        collector_tls: list[str] = []
        cas: dict[str, bytes | None] = {"leader": None, "helper": None}
        if tls:
            for role in ("leader", "helper"):
                ca = issue(dep / role / "tls", role, tmp_path)
                cas[role] = ca.read_bytes()
                client_tls += [f"--{role}-ca", str(ca)]
            shutil.copy(tmp_path / "helper-ca.crt", dep / "leader" / "tls" / "helper-ca.crt")
            collector_tls = ["--leader-ca", str(tmp_path / "leader-ca.crt")]
        servers = {
            role: ServerProcess(
                role, dep / role / f"{role}.toml", tmp_path / f"{role}.log", address
            )
            for role, address in (("helper", helper), ("leader", leader))
        }
        for role, server in servers.items():
            server.start(root_certificates=cas[role])
            started.append(server)
        return Deployed(
            tmp_path, dep, opens, closes, servers["helper"], servers["leader"],
            client_tls, collector_tls, cas["helper"],
        )  # fmt: skip

    yield run
    for server in started:
        server.stop()


def check_results(results: Path, answers: list[dict[str, Any]]) -> None:
    expected = truth(answers)
    published = json.loads((results / "results.json").read_text())
    assert [q["question"] for q in published] == list(LABELS)
    for q in published:
        assert q["n"] == len(answers), q
        assert q["epsilon"] == "0.4" and q["delta"] == "0"
        assert [r["label"] for r in q["rows"]] == LABELS[q["question"]]
        for row in q["rows"]:
            true = expected[q["question"]][row["label"]]
            assert row["ci_low"] <= true <= row["ci_high"], (q["question"], row, true)
    csv_lines = (results / "results.csv").read_text().splitlines()
    assert csv_lines[0] == "question,kind,n,label,estimate,ci_low,ci_high,note"
    assert len(csv_lines) == 1 + sum(len(v) for v in LABELS.values())
    page = (results / "report.html").read_text()
    assert "Journey" in page and "<svg" in page and "Rate workload and pay" in page
    for external in ("http://", "https://", "<script", "<link"):
        assert external not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_survey_with_tls(deploy: Any) -> None:
    d = deploy(tls=True)
    answers = panel(300, seed=1)
    jsonl = d.root / "panel.jsonl"
    jsonl.write_text("".join(json.dumps(a) + "\n" for a in answers))
    done = veil("survey", "respond", "--survey-dir", d.client, "--answers", jsonl, *d.client_tls)
    assert done.returncode == 0, done.stderr
    assert "sent 1500 answers of 300 respondents" in done.stdout
    d.close()
    results = d.root / "results"
    out = veil(
        "survey", "collect", "--survey-dir", d.collector, "--out", results,
        "--confidence", CONFIDENCE, *d.collector_tls,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    check_results(results, answers)


def test_seven_respondents(deploy: Any) -> None:
    # The issue's survey: 7 respondents at ε = 0.25 per question. Every figure
    # published is possible, each question says it is indicative, and
    # results.json keeps the raw unbiased estimates.
    d = deploy(tls=False, epsilon="1.25", min_batch_size=5)
    answers = panel(7, seed=3)
    jsonl = d.root / "panel.jsonl"
    jsonl.write_text("".join(json.dumps(a) + "\n" for a in answers))
    done = veil("survey", "respond", "--survey-dir", d.client, "--answers", jsonl)
    assert done.returncode == 0, done.stderr
    d.close()
    results = d.root / "results"
    out = veil("survey", "collect", "--survey-dir", d.collector, "--out", results)
    assert out.returncode == 0, out.stderr
    print(out.stdout)
    banner = "too few respondents for this privacy level: treat as indicative only"
    assert out.stdout.count(banner) == 5, out.stdout
    top = {"yes_no": 7, "choice": 7, "multi_choice": 7, "vector": 10}
    for q in json.loads((results / "results.json").read_text()):
        assert q["n"] == 7 and q["indicative_only"] and q["note"] == banner
        for row in q["rows"]:
            low, high = row["possible"]
            assert low <= row["ci_low"] <= row["estimate"] <= row["ci_high"] <= high, row
            assert row["raw_ci_low"] <= row["raw_estimate"] <= row["raw_ci_high"]
            # The raw interval is the noise's: at ε = 0.25 it is wider than the range.
            assert row["raw_ci_high"] - row["raw_ci_low"] > high - low
    for row in csv.DictReader(io.StringIO((results / "results.csv").read_text())):
        limit = 840 if row["label"] == "sum" else top.get(row["kind"], 120)
        assert 0 <= float(row["ci_low"]) <= float(row["estimate"]) <= float(row["ci_high"])
        assert float(row["ci_high"]) <= limit and row["note"] == banner
    page = (results / "report.html").read_text()
    assert page.count(banner.capitalize()) == 5
    cells = re.findall(r"<td>([^<]*)</td>", page)
    assert cells and not any(c.startswith("-") or " to -" in c for c in cells)


def test_collect_frictions(deploy: Any) -> None:
    # Tried as an operator would: the helper down while collecting, Ctrl-C,
    # status meanwhile, and collecting again into another --out.
    d = deploy(tls=False, epsilon="1.25", min_batch_size=3)
    answers = panel(5, seed=4)
    jsonl = d.root / "panel.jsonl"
    jsonl.write_text("".join(json.dumps(a) + "\n" for a in answers))
    done = veil("survey", "respond", "--survey-dir", d.client, "--answers", jsonl)
    assert done.returncode == 0, done.stderr
    d.close()
    # Stopped before or after the leader aggregated the five reports (the
    # former on a busy machine), the collection says it is retrying (a job
    # whose reports were not aggregated said only "waiting" for as long as
    # the helper was away: leader.collection.note_helper_away).
    d.helper.stop()
    results = d.root / "results"
    # Ctrl-C as at a terminal: the child takes SIGINT as Python's
    # KeyboardInterrupt whatever it inherits. A child inherits an ignored
    # signal, and pytest run in the background (`pytest &`) starts with
    # SIGINT ignored, so `python -m veil.cli` would never see it.
    interruptible = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
        " from veil.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    args = [
        sys.executable, "-c", interruptible, "survey", "collect",
        "--survey-dir", str(d.collector), "--out", str(results),
    ]  # fmt: skip
    env = dict(os.environ, VEIL_LOG_LEVEL="error")
    collect = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    assert collect.stderr is not None
    # However it ends, the collector is not left running (a failed assertion
    # below would leave it retrying for good).
    try:
        os.set_blocking(collect.stderr.fileno(), False)
        seen: list[tuple[float, str]] = []
        started = time.monotonic()
        # The waiting collection says what it waits for, at least every 10 s:
        # 25 s from its first word, however long the process took to start (20 s
        # and more on a busy machine, where 25 s from the launch saw two lines).
        first: float | None = None
        while first is None or time.monotonic() - first < 25:
            assert first is not None or time.monotonic() - started < 180, seen
            ready, _, _ = select.select([collect.stderr], [], [], 0.5)
            if ready:
                for line in collect.stderr.read().splitlines():
                    seen.append((time.monotonic(), line))
            said = [t for t, line in seen if "retrying:" in line]
            first = said[0] if said else None
            if len(said) >= 3:
                break
        retrying = [(t, line) for t, line in seen if "retrying:" in line]
        assert len(retrying) >= 3, seen
        assert all("next try in" in line for _, line in retrying)
        # The leader's reason, said once ("retrying: retrying: ..." before).
        assert not any("retrying: retrying" in line for _, line in retrying), retrying
        assert all(b - a <= 10 for (a, _), (b, _) in itertools.pairwise(retrying))

        status = veil("survey", "status", "--survey-dir", d.collector)
        assert status.returncode == 0, status.stderr
        assert "closed: collecting" in status.stdout and "retrying: " in status.stdout
        assert "retrying: retrying" not in status.stdout
        assert "ready to collect" not in status.stdout

        collect.send_signal(signal.SIGINT)
        collect.wait(timeout=30)
        os.set_blocking(collect.stderr.fileno(), True)
        rest = collect.stderr.read()
        assert collect.returncode == 130, rest
        assert rest.strip().splitlines()[-1] == (
            "veil survey collect: interrupted: run the same command again to resume"
        )
    finally:
        if collect.poll() is None:
            collect.kill()
            collect.wait()
        collect.stderr.close()
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest

    d.helper.start()
    again = veil("survey", "collect", "--survey-dir", d.collector, "--out", results)
    assert again.returncode == 0, again.stderr
    # The collect summary shows the intervals.
    assert re.search(r"remote: n = 5; yes [\d.]+ \[[\d.]+, [\d.]+\]", again.stdout), again.stdout

    # Into another --out: where it was collected, and no "run the same command".
    other = veil("survey", "collect", "--survey-dir", d.collector, "--out", d.root / "other")
    assert other.returncode == 2
    assert f"this survey is collected into {results.resolve()}" in other.stderr
    assert "run the same command again" not in other.stderr
    assert not (d.root / "other").exists()
    # A copy of collector/ that does not know: the leader's refusal, said as such.
    copy = d.root / "collector-copy"
    shutil.copytree(d.collector, copy)
    (copy / "collected-into.json").unlink()
    third = veil("survey", "collect", "--survey-dir", copy, "--out", d.root / "third")
    assert third.returncode == 1
    assert "already collected by another collection" in third.stderr
    assert "another run of veil survey collect" in third.stderr
    assert "run the same command again" not in third.stderr
    assert d.collections() == 5


def pty_session(args: list[str], replies: list[str], timeout: float = 180) -> tuple[int, str]:
    """Run a command on a pseudo-terminal, sending each reply after the next
    prompt (every prompt ends in "> "); its exit status and everything shown.
    `timeout` bounds the whole session: a deadline on conditions (a prompt,
    the exit), so a generous one costs nothing when they come; 60 s ran out
    while the respondent sent its answers in a full run beside two
    CPU-bound processes."""
    master, slave = os.openpty()
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + timeout

    def read(until_prompt: bool) -> bool:
        nonlocal shown
        mark = len(shown)
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    return False
                if not chunk:
                    return False
                shown += chunk
                if until_prompt and shown[mark:].rstrip(b" ").endswith(b">"):
                    return True
            elif proc.poll() is not None and not until_prompt:
                return False
        raise AssertionError(f"timed out; the terminal showed:\n{shown.decode(errors='replace')}")

    try:
        for reply in replies:
            assert read(until_prompt=True), shown.decode(errors="replace")
            os.write(master, reply.encode() + b"\n")
        read(until_prompt=False)
        return proc.wait(timeout=30), shown.decode(errors="replace").replace("\r\n", "\n")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_survey_plaintext_journey(deploy: Any) -> None:
    d = deploy(tls=False)
    results = d.root / "results"

    # Collecting before the window closes is refused, nothing closed.
    early = veil("survey", "collect", "--survey-dir", d.collector, "--out", results)
    assert early.returncode == 2
    assert "the survey closes at" in early.stderr and "nothing was collected" in early.stderr
    assert d.collections() == 0

    # 300 respondents from a panel file, one from a TOML file, one at a terminal.
    answers = panel(300, seed=2)
    jsonl = d.root / "panel.jsonl"
    jsonl.write_text("".join(json.dumps(a) + "\n" for a in answers))
    done = veil("survey", "respond", "--survey-dir", d.client, "--answers", jsonl)
    assert done.returncode == 0, done.stderr
    one = d.root / "me.toml"
    one.write_text(
        'remote = "no"\ncommute = 12\nteam = "sales"\ntools = ["wiki"]\nratings = [3, 4]\n'
    )
    done = veil("survey", "respond", "--survey-dir", d.client, "--answers", one)
    assert done.returncode == 0 and "sent 5 answers of 1 respondent" in done.stdout, done.stderr
    answers.append(
        {"remote": False, "commute": 12, "team": "sales", "tools": ["wiki"], "ratings": [3, 4]}
    )
    rc, shown = pty_session(
        [sys.executable, "-m", "veil.cli", "survey", "respond", "--survey-dir", str(d.client)],
        ["yes", "500", "25", "2", "1, chat", "5,6", "y"],
    )
    assert rc == 0, shown
    assert "1/5 Do you work remotely most days?" in shown
    assert "  2) design" in shown
    assert "'commute': '500' is not an allowed answer; give a whole number from 0 to 120" in shown
    assert "Which tools do you use daily?: email, chat" in shown
    assert "sent 5 answers of 1 respondent" in shown
    answers.append(
        {"remote": True, "commute": 25, "team": "design", "tools": ["email", "chat"],
         "ratings": [5, 6]}
    )  # fmt: skip

    status = veil("survey", "status", "--survey-dir", d.collector)
    assert status.returncode == 0, status.stderr
    assert "open, closes in" in status.stdout
    assert status.stdout.count(f" {len(answers)} ") == 5, status.stdout
    d.close()

    # A collector file with another key: refused before anything is closed.
    wrong = d.root / "collector-wrong"
    shutil.copytree(d.collector, wrong)
    other = generate_keypair(7)
    doc = load_task(wrong / "team.toml")
    write_toml(
        wrong / "team.toml",
        replace(doc, collector_hpke_keypair=other, collector_hpke_config=other.config).to_dict(),
        secret=True,
    )
    out = veil("survey", "collect", "--survey-dir", wrong, "--out", d.root / "wrong-results")
    assert out.returncode == 2, out.stderr
    assert "question 'team'" in out.stderr and "another collector key" in out.stderr
    assert d.collections() == 0
    assert not (d.root / "wrong-results" / "state.json").exists()

    # The collector killed mid-way (the helper down, so the first job stays
    # pending): run again, and the same jobs finish; no question collected twice.
    d.helper.stop()
    args = [
        sys.executable, "-m", "veil.cli", "survey", "collect", "--survey-dir", str(d.collector),
        "--out", str(results), "--confidence", CONFIDENCE,
    ]  # fmt: skip
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = results / "state.json"
    try:
        # Killed once its first job has reached the leader (the job is saved
        # in state.json before it is sent).
        deadline = time.monotonic() + 60
        while not (state.exists() and json.loads(state.read_text())["jobs"]) or (
            d.collections() == 0
        ):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
    finally:  # however the wait ends, the collector is killed and reaped
        first.send_signal(signal.SIGKILL)
        first.wait()
    started = json.loads(state.read_text())["jobs"]
    assert list(started) == ["remote"]
    d.helper.start()
    out = veil(*args[3:])
    assert out.returncode == 0, out.stderr
    assert f"remote: resuming job {started['remote']}" in out.stderr
    assert json.loads(state.read_text())["jobs"]["remote"] == started["remote"]
    assert d.collections() == 5  # one per question
    check_results(results, answers)

    # Run again: the same results from the same jobs, nothing new collected.
    before = (results / "results.json").read_text()
    again = veil(*args[3:])
    assert again.returncode == 0 and d.collections() == 5
    assert (results / "results.json").read_text() == before

    screenshot_is_not_blank(results / "report.html", d.root / "report.png")


def screenshot_is_not_blank(page: Path, png: Path) -> None:
    """Open the page in headless Chromium (Debian's `chromium`); fail, not
    skip, under CI when it is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing (.ci/run installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    subprocess.run(
        [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--screenshot={png}", "--window-size=1000,1600", page.as_uri(),
        ],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    from PIL import Image

    with Image.open(png) as image:
        grey = image.convert("L").histogram()
        colours = len(image.convert("RGB").getcolors(maxcolors=1 << 20) or [])
    dark = sum(grey[:200])
    assert dark > 0.01 * sum(grey), dark  # text and bars, not an empty page
    assert colours > 20, colours
