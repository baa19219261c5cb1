"""An operator's view of a running demo deployment: `veil status`, the
leader's metrics and the database size before and after garbage collection.

Starts the example survey's leader and helper (metrics on, background GC off
so that `veil gc` shows what it frees), lets simulated respondents answer
(5 questions x 2,000 respondents = 10,000 reports), collects every question,
then prints what an operator would run, and stops the servers.

    python scripts/ops_snapshot.py [--respondents 2000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from veil.local.demo import example_survey, run_on
from veil.local.launcher import LocalDeployment
from veil.survey.tasks import task_specs

# Metric families worth showing (the rest are histogram buckets and help text).
INTERESTING = (
    "veil_reports_",
    "veil_uploads_",
    "veil_aggregation_jobs_total",
    "veil_aggregation_job_seconds_count",
    "veil_aggregation_job_seconds_sum",
    "veil_verify_seconds_per_report_count",
    "veil_verify_seconds_per_report_sum",
    "veil_hpke_",
    "veil_collections_total",
    "veil_budget_",
    "veil_gc_runs_total",
    "veil_storage_bytes",
)


def run(*args: str, cwd: Path) -> str:
    print(f"$ veil {' '.join(args)}")
    out = subprocess.run(
        [sys.executable, "-m", "veil.cli", *args], cwd=cwd, capture_output=True, text=True
    )
    text = out.stdout + out.stderr
    print(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--respondents", type=int, default=2000)
    parser.add_argument("--keep", help="directory for the deployment (kept afterwards)")
    args = parser.parse_args()
    survey = example_survey()
    with tempfile.TemporaryDirectory(prefix="veil-ops-") as tmp:
        root = Path(args.keep or tmp)
        dep = LocalDeployment.start(
            root, task_specs(survey), metrics=True, extra_config={"gc": {"interval": 0}}
        )
        try:
            run_on(dep, survey, args.respondents, progress=False)
            run("status", "--config", "leader.toml", cwd=root)
            assert dep.leader.metrics_address is not None
            url = f"http://{dep.leader.metrics_address}/metrics"
            print(f"$ curl -s {url} | grep -v '^#' | grep -v _bucket")
            with urllib.request.urlopen(url, timeout=10) as resp:
                for line in resp.read().decode().splitlines():
                    name = line.split("{", 1)[0].split(" ", 1)[0]
                    if line.startswith(INTERESTING) and not name.endswith("_created"):
                        print(line)
            print()
            run("gc", "--vacuum", "--config", "leader.toml", cwd=root)
            run("gc", "--vacuum", "--config", "helper.toml", cwd=root)
        finally:
            dep.stop()


if __name__ == "__main__":
    main()
