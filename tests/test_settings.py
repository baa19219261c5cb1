"""The strict reader shared by every TOML file veil reads: unknown settings and
wrong types are refused at their file and line, in every kind of file."""

from __future__ import annotations

from pathlib import Path

import pytest

from veil.aggregator.run.config import ConfigError, load_config
from veil.settings import SettingsError, parse_toml
from veil.survey import SurveyError, parse_survey
from veil.task import DpSpec, TaskError, VdafSpec, load_task, new_task, write_toml


def _task_file(tmp_path: Path, edit: str = "", role: str = "helper") -> Path:
    files = new_task(
        VdafSpec("sum", max_measurement=10),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=100,
        dp=DpSpec("geometric", epsilon="1"),
    )
    path = tmp_path / f"t.{role}.toml"
    write_toml(path, getattr(files, role).to_dict(), secret=True)
    if edit:
        path.write_text(path.read_text().replace(*edit.split("|")))
    return path


def _line(path: Path, text: str) -> int:
    return next(i + 1 for i, ln in enumerate(path.read_text().splitlines()) if text in ln)


def test_misspelt_min_batch_size_is_refused_not_defaulted(tmp_path: Path) -> None:
    """Before: `min_batch_sise = 100` loaded as min_batch_size = 1."""
    path = _task_file(tmp_path, "min_batch_size = 100|min_batch_sise = 100")
    with pytest.raises(TaskError) as e:
        load_task(path)
    line = _line(path, "min_batch_sise")
    assert str(e.value).startswith(f"{path}:{line}: unknown setting 'min_batch_sise'")
    assert "in the top level; expected one of" in str(e.value)
    assert "min_batch_size" in str(e.value)


@pytest.mark.parametrize(
    ("edit", "key", "message"),
    [
        ('type = "sum"|type = "sum"\nmax_measurment = 3', "max_measurment", r"in \[vdaf\]"),
        ('mechanism = "geometric"|mechanism = "geometric"\nepsilonn = 1', "epsilonn", r"\[dp\]"),
        ("min_batch_size = 100|min_batch_size = 1.5", "min_batch_size", "must be an integer"),
        ("min_batch_size = 100|min_batch_size = true", "min_batch_size", "must be an integer"),
        (
            'max_measurement = 10|max_measurement = "10"',
            "max_measurement",
            "must be an integer, got '10' \\(a string\\)",
        ),
        ('epsilon = "1"|epsilon = [1]', "epsilon", "must be a number"),
        ("[vdaf]|vdaf_table = 1\n[vdaf]", "vdaf_table", "unknown setting"),
    ],
)
def test_task_file_mistakes_name_the_line(
    tmp_path: Path, edit: str, key: str, message: str
) -> None:
    path = _task_file(tmp_path, edit)
    with pytest.raises(TaskError, match=message) as e:
        load_task(path)
    assert str(e.value).startswith(f"{path}:{_line(path, key)}:"), str(e.value)


def test_task_file_round_trip_and_missing_settings(tmp_path: Path) -> None:
    path = _task_file(tmp_path)
    assert load_task(path).min_batch_size == 100
    for missing in ("min_batch_size = 100\n", "task_id = "):
        text = path.read_text()
        start = text.index(missing)
        end = text.index("\n", start) + 1
        path.write_text(text[:start] + text[end:])
        with pytest.raises(TaskError, match="lacks the required setting"):
            load_task(path)
        path = _task_file(tmp_path)


def _server(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "leader.toml"
    path.write_text('listen = "127.0.0.1:1"\nstorage = "l.db"\n' + body)
    return path


def test_misspelt_client_ca_in_tls_is_refused(tmp_path: Path) -> None:
    """Before: `clientca` in [tls] was ignored, and mutual TLS silently off."""
    path = _server(tmp_path, '[tls]\ncert = "c.pem"\nkey = "k.pem"\nclientca = "ca.pem"\n')
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == (
        f"{path}:6: unknown setting 'clientca' in [tls]; expected one of cert, client_ca, key"
    )


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("[helper_tls]\nca_file = 'x'\n", 4, r"unknown setting 'ca_file' in \[helper_tls\]"),
        ("[driver]\njob_size = '500'\n", 4, "'job_size' in \\[driver\\] must be an integer"),
        ("[driver]\nenabled = 'no'\n", 4, "must be true or false"),
        ("[keys]\npending_second = 1\n", 4, r"unknown setting 'pending_second' in \[keys\]"),
        ("[metrics]\nlisten = 9101\n", 4, "must be a string"),
        ("[gc]\ninterval = -1\n", 4, "must not be negative"),
        ("[driver]\nmax_helper_clock_lag = -5\n", 4, "must not be negative"),
        ("[driver]\nmax_helper_clock_lag = '1h'\n", 4, "must be a number"),
        ("tasks = 'a.toml'\n", 3, "must be a list of strings"),
        ("max_message_bytes = 1e6\n", 3, "must be an integer"),
        ("[storage2]\nurl = 'x'\n", 3, "unknown setting 'storage2' in the top level"),
        ("[connections]\nworkers = 0\n", 4, "'workers' in \\[connections\\] must be at least 1"),
        ("[connections]\nreceive_seconds = '30'\n", 4, "must be a number"),
        ("[connections]\nreceive_seconds = 0\n", 4, "must be at least 0.001"),
        ("[connections]\nmax_waiting_calls = 1.5\n", 4, "must be an integer"),
        ("[connections]\nidle = 5\n", 4, r"unknown setting 'idle' in \[connections\]"),
    ],
)
def test_server_config_mistakes_name_the_line(
    tmp_path: Path, body: str, line: int, message: str
) -> None:
    path = _server(tmp_path, body)
    with pytest.raises(ConfigError, match=message) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}:{line}:"), str(e.value)


def test_a_bad_task_file_is_reported_through_the_server_config(tmp_path: Path) -> None:
    task = _task_file(tmp_path, "min_batch_size = 100|min_batch_sise = 100")
    path = _server(tmp_path, f'tasks = ["{task.name}"]\n')
    with pytest.raises(ConfigError, match=rf"{task}:\d+: unknown setting 'min_batch_sise'"):
        load_config(path)


def test_survey_file_mistakes_name_the_line() -> None:
    text = '[survey]\nname = "s"\nepsilon = 1\nmin_batch_sise = 5\n[[question]]\nid = "a"\n'
    with pytest.raises(SurveyError) as e:
        parse_survey(text + 'kind = "yes_no"\n', "s.toml")
    assert str(e.value).startswith("s.toml:4: unknown setting 'min_batch_sise' in [survey]")
    good = '[survey]\nname = "s"\nepsilon = 1\n[[question]]\nid = "a"\nkind = "yes_no"\n'
    with pytest.raises(SurveyError) as e:
        parse_survey(good + '[[question]]\nid = "b"\nkind = "integer"\nmax = 5\nweigth = 2\n', "s")
    assert str(e.value).startswith("s:11: unknown setting 'weigth' in [[question]] #2")


def test_lines_of_inline_tables_and_hostile_documents() -> None:
    # A key inside an inline table is reported at the line naming the table.
    doc = parse_toml("a = 1\n\nt = { x = 1, y = 2 }\n", "f.toml", ("a", "t"))
    with pytest.raises(SettingsError, match=r"^f.toml:3: unknown setting 'y' in \[t\]"):
        doc.table("t", ("x",))
    with pytest.raises(SettingsError, match=r"^f.toml: not valid TOML"):
        parse_toml("a = \n", "f.toml", ("a",))
    with pytest.raises(SettingsError, match=r"must be a table"):
        parse_toml("t = 3\n", "f.toml", ("t",)).table("t", ())
    with pytest.raises(SettingsError, match=r"must be a finite number"):
        parse_toml("t = nan\n", "f.toml", ("t",)).number("t")


def test_task_new_reads_the_configs_it_extends_strictly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from veil.cli import main

    config = tmp_path / "leader.toml"
    config.write_text('listen = "127.0.0.1:1"\nstorage = "l.db"\nlisten_port = 7\n')
    args = ["task", "new", "--vdaf", "count", "--leader", "127.0.0.1:1", "--helper", "h:2"]
    code = main([*args, "--out", str(tmp_path / "t"), "--leader-config", str(config)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"veil task new: {config}:3: unknown setting 'listen_port'")
    assert not (tmp_path / "t").exists()  # nothing written


def test_each_default_is_defined_once(tmp_path: Path) -> None:
    """Before: `veil task new --min-batch-size` defaulted to 10, task.py to 1."""
    import dataclasses

    from veil.aggregator.run.config import ServerConfig
    from veil.cli import build_parser
    from veil.task import (
        DEFAULT_MAX_CLOCK_SKEW,
        DEFAULT_MIN_BATCH_SIZE,
        DEFAULT_TIME_PRECISION,
    )

    args = build_parser().parse_args(
        ["task", "new", "--vdaf", "count", "--leader", "a:1", "--helper", "b:2"]
    )
    assert args.min_batch_size == DEFAULT_MIN_BATCH_SIZE
    assert args.time_precision == DEFAULT_TIME_PRECISION
    assert args.max_clock_skew == DEFAULT_MAX_CLOCK_SKEW
    # A task file must state min_batch_size (no silent default), and so must new_task.
    with pytest.raises(TypeError, match="min_batch_size"):
        new_task(VdafSpec("count"), "a:1", "b:2", dp=DpSpec("none"))  # type: ignore[call-arg]
    # What the reader fills in for a setting left out is the dataclass's default.
    path = _server(tmp_path, "")
    read = load_config(path)
    for f in dataclasses.fields(ServerConfig):
        if f.name in ("listen", "storage", "tasks", "task_paths"):
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        assert getattr(read, f.name) == default, f.name
