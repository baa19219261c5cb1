"""Fuzzing the decoders outside veil.vdaf (tests/vdaf/spec/test_fuzz.py covers
those): HPKE opening of input and aggregate shares, the collector's opening
of aggregate shares, the protocol messages, task files and server configs.
Each may raise only its documented error. With atheris installed (the
optional `fuzz` extra), a coverage-guided run over the same decoders and the
Prio3 ones is added.
"""

from __future__ import annotations

import contextlib
import importlib.util
import random
import secrets
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.modes import LONG
from tests.support.mutate import mutate, mutations
from tests.support.reliability import record
from veil.aggregator.run.config import ConfigError, load_config
from veil.collector import CollectionError, Collector
from veil.hpke import (
    ROLE_LEADER,
    Ciphertext,
    HpkeError,
    agg_share_info,
    generate_keypair,
    input_share_info,
    open_,
    seal,
)
from veil.protocol.v1 import helper_pb2, leader_pb2, messages_pb2
from veil.task import DpSpec, Task, TaskError, VdafSpec, load_task, new_task

pytestmark = pytest.mark.fuzz

EXAMPLES = 10_000 if LONG else 200
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)

KEYPAIR = generate_keypair(7)
TASK_ID = bytes(range(32))
INFO = input_share_info(ROLE_LEADER, TASK_ID, bytes(16), 3600, b"public")
CT = seal(KEYPAIR.config, INFO, b"an input share of some length")
FILES = new_task(
    VdafSpec("sumvec", length=3, max_measurement=7, chunk_length=2),
    "127.0.0.1:1",
    "127.0.0.1:2",
    min_batch_size=10,
    dp=DpSpec("geometric", epsilon="1"),
)


@FUZZ
@given(
    config_id=st.integers(0, 255),
    enc=st.one_of(
        st.just(CT.enc), st.binary(max_size=40), mutations.map(lambda o: mutate(CT.enc, o))
    ),
    payload=st.one_of(st.binary(max_size=80), mutations.map(lambda o: mutate(CT.payload, o))),
    info=st.one_of(st.just(INFO), mutations.map(lambda o: mutate(INFO, o))),
)
def test_hpke_open_raises_only_hpke_error(
    config_id: int, enc: bytes, payload: bytes, info: bytes
) -> None:
    try:
        plain = open_(KEYPAIR, Ciphertext(config_id, enc, payload), info)
    except HpkeError:
        return
    # Only the untouched ciphertext opens.
    assert (config_id, enc, payload, info) == (CT.config_id, CT.enc, CT.payload, INFO)
    assert plain == b"an input share of some length"


_COLLECTOR = Collector(FILES.collector)  # the channel is lazy: nothing is dialled
_VDAF = FILES.collector.vdaf.instantiate()
_SHARE = _VDAF.encode_agg_share([1, 2, 3])
_DP_PARAMS = FILES.collector.dp.binding(FILES.collector.vdaf)


def _sealed_share(start: int, count: int) -> Ciphertext:
    assert FILES.collector.collector_hpke_config is not None
    info = agg_share_info(
        ROLE_LEADER, FILES.collector.task_id, start, 3600, count, dp_params=_DP_PARAMS
    )
    return seal(FILES.collector.collector_hpke_config, info, _SHARE)


class _Pb:
    def __init__(self, ct: Ciphertext) -> None:
        self.config_id, self.enc, self.payload = ct.config_id, ct.enc, ct.payload


@FUZZ
@given(
    plaintext=st.one_of(st.binary(max_size=64), mutations.map(lambda o: mutate(_SHARE, o))),
    count=st.integers(0, 2**64 - 1),
)
def test_collector_opens_or_raises_collection_error(plaintext: bytes, count: int) -> None:
    assert FILES.collector.collector_hpke_config is not None
    info = agg_share_info(
        ROLE_LEADER, FILES.collector.task_id, 0, 3600, count, dp_params=_DP_PARAMS
    )
    ct = seal(FILES.collector.collector_hpke_config, info, plaintext)
    try:
        share = _COLLECTOR._open(ROLE_LEADER, _Pb(ct), 0, 3600, count)
    except CollectionError:
        return
    assert _VDAF.encode_agg_share(share) == plaintext
    # The same share claimed for another report count does not open.
    with pytest.raises(CollectionError):
        _COLLECTOR._open(ROLE_LEADER, _Pb(ct), 0, 3600, count ^ 1)


MESSAGES = [
    messages_pb2.HpkeConfigRequest,
    messages_pb2.HpkeConfigList,
    leader_pb2.UploadRequest,
    leader_pb2.UploadResponse,
    leader_pb2.CreateCollectionRequest,
    leader_pb2.GetCollectionRequest,
    leader_pb2.CollectionJob,
    helper_pb2.AggregationJobRequest,
    helper_pb2.AggregationJobResponse,
    helper_pb2.AggregateShareRequest,
    helper_pb2.AggregateShareResponse,
]


@FUZZ
@given(cls=st.sampled_from(MESSAGES), data=st.binary(max_size=256))
def test_protocol_messages_raise_only_decode_error(cls: Any, data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        cls.FromString(data)


_TOML_VALUES = st.recursive(
    st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.text(max_size=12),
        st.booleans(),
        st.floats(allow_nan=False),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _perturb(base: dict[str, Any], draw: Any) -> dict[str, Any]:
    """`base` with some keys removed, replaced by random values, or added."""
    out = dict(base)
    keys = draw(st.lists(st.sampled_from(sorted(base)), max_size=3)) if base else []
    for key in keys:
        if draw(st.booleans()):
            out.pop(key, None)
        else:
            out[key] = draw(_TOML_VALUES)
    for key, value in draw(st.dictionaries(st.text(max_size=8), _TOML_VALUES, max_size=2)).items():
        out[key] = value
    return out


@FUZZ
@given(data=st.data(), role=st.sampled_from(["leader", "helper", "collector", "client"]))
def test_task_files_raise_only_task_error(tmp_path: Path, data: st.DataObject, role: str) -> None:
    d = _perturb(getattr(FILES, role).to_dict(), data.draw)
    for sub in ("vdaf", "dp", "collector_hpke_config"):
        if isinstance(d.get(sub), dict) and data.draw(st.booleans()):
            d[sub] = _perturb(d[sub], data.draw)
    with contextlib.suppress(TaskError):
        Task.from_dict(d)
    path = tmp_path / "task.toml"
    path.write_bytes(mutate(tomli_w.dumps(d).encode(), data.draw(mutations)))
    with contextlib.suppress(TaskError):
        load_task(path)


_CONFIG = {
    "listen": "127.0.0.1:7001",
    "storage": "leader.db",
    "tasks": [],
    "max_message_bytes": 1 << 20,
    "grace_seconds": 5,
    "driver": {"interval": 0.5, "job_size": 10},
    "tls": {"cert": "a.pem", "key": "a.key"},
    "metrics": {"listen": "127.0.0.1:9101"},
    "log_format": "text",
}


@FUZZ
@given(data=st.data())
def test_server_configs_raise_only_config_error(tmp_path: Path, data: st.DataObject) -> None:
    d = _perturb(_CONFIG, data.draw)
    for sub in ("driver", "tls", "metrics"):
        if isinstance(d.get(sub), dict) and data.draw(st.booleans()):
            d[sub] = _perturb(d[sub], data.draw)
    path = tmp_path / "server.toml"
    path.write_bytes(mutate(tomli_w.dumps(d).encode(), data.draw(mutations)))
    with contextlib.suppress(ConfigError):
        load_config(path)


def test_generated_toml_is_valid() -> None:
    """The fuzzer's base documents parse: mutations start from valid input."""
    assert tomllib.loads(tomli_w.dumps(_CONFIG))["listen"] == "127.0.0.1:7001"
    assert Task.from_dict(FILES.leader.to_dict()) == FILES.leader
    record(
        "fuzz_decoders",
        hypothesis_cases_per_decoder=EXAMPLES,
        decoders=5,
        total=5 * EXAMPLES,
    )


ATHERIS_RUNS = 100_000 if LONG else 5_000


@pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None,
    reason="atheris is not installed (optional: pip install -e '.[fuzz]')",
)
def test_atheris_coverage_guided() -> None:
    target = Path(__file__).with_name("atheris_decoders.py")
    seed = random.Random(secrets.randbits(32)).randrange(1, 2**31)
    proc = subprocess.run(
        [
            sys.executable,
            str(target),
            f"-runs={ATHERIS_RUNS}",
            f"-seed={seed}",
            "-rss_limit_mb=2048",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    record("fuzz_atheris", runs=ATHERIS_RUNS, seed=seed, exit=proc.returncode)
