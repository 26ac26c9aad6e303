"""`stillhere serve` options: durations, env vars, defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from actors.persona import Persona
from transport.config import Settings, add_options, collector_pace, parse_duration, settings_from


def _parse(argv: list[str]) -> Settings:
    parser = argparse.ArgumentParser()
    add_options(parser)
    return settings_from(parser.parse_args(argv))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("2h", 7200), ("250ms", 0.25), ("45", 45), ("7d", 604800)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 minutes", "-3s", "1w"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_defaults_match_the_documented_ones() -> None:
    settings = _parse([])
    assert (settings.resume_window, settings.sweep_interval) == (1800, 300)
    assert settings.data_dir == Path(".stillhere") and settings.db is None
    assert settings.window_turns == 40 and settings.log_format == "text"
    assert settings.backlog == 4096 and _parse(["--backlog", "64"]).backlog == 64


def test_env_vars_set_options_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STILLHERE_RESUME_WINDOW", "90s")
    monkeypatch.setenv("STILLHERE_MAX_TEXT_CHARS", "100")
    monkeypatch.setenv("STILLHERE_INTERRUPT_WORDS", "stop, halt")
    settings = _parse(["--sweep-interval", "2m"])
    assert settings.resume_window == 90 and settings.sweep_interval == 120
    assert settings.limits.max_text_chars == 100
    assert settings.interrupt_words == ("stop", "halt")
    assert _parse(["--resume-window", "1h"]).resume_window == 3600


def test_a_bad_log_format_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(["--log-format", "xml"])
    assert "invalid choice" in capsys.readouterr().err


def test_compute_threads_default_to_one_and_refuse_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        _parse([]).compute_threads == 1 and _parse(["--compute-threads", "2"]).compute_threads == 2
    )
    with pytest.raises(SystemExit):
        _parse(["--compute-threads", "0"])
    assert "at least 1" in capsys.readouterr().err


def test_the_event_loop_is_uvloop_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert _parse([]).event_loop == "uvloop"
    assert _parse(["--event-loop", "asyncio"]).event_loop == "asyncio"
    with pytest.raises(SystemExit):
        _parse(["--event-loop", "trio"])
    assert "invalid choice" in capsys.readouterr().err


def test_gc_thresholds_default_and_bad_ones_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert _parse([]).gc_thresholds == (10_000, 50, 100)
    assert _parse(["--gc-thresholds", "700,10,10"]).gc_thresholds == (700, 10, 10)
    for bad in ("700,10", "a,b,c", "0,10,10", "1,2,3,4"):
        with pytest.raises(SystemExit):
            _parse(["--gc-thresholds", bad])
        assert "three whole numbers" in capsys.readouterr().err


def test_the_collector_is_paced_by_default_and_bad_paces_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    default = collector_pace(_parse([]))
    assert (default.young_every_s, default.full_every_s) == (0.5, 600.0)
    chosen = collector_pace(_parse(["--gc-young-every", "250ms", "--gc-full-every", "30m"]))
    assert (chosen.young_every_s, chosen.full_every_s) == (0.25, 1800.0)
    assert collector_pace(_parse(["--gc-young-every", "0"])).young_every_s == 0
    for option, bad, says in (
        ("--gc-young-every", "-1s", "not a duration"),
        ("--gc-full-every", "0", "above 0"),
        ("--gc-full-every", "soon", "not a duration"),
    ):
        with pytest.raises(SystemExit):
            _parse([f"{option}={bad}"])
        assert says in capsys.readouterr().err


def test_the_switch_interval_defaults_to_20_ms_and_must_be_above_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _parse([]).switch_interval == 0.02
    assert _parse(["--switch-interval", "5ms"]).switch_interval == 0.005
    with pytest.raises(SystemExit):
        _parse(["--switch-interval", "0"])
    assert "above 0" in capsys.readouterr().err


def test_the_context_cache_defaults_to_a_minute_and_zero_turns_it_off() -> None:
    assert _parse([]).context_cache == 60
    assert _parse(["--context-cache", "0"]).context_cache == 0
    assert _parse(["--context-cache", "5m"]).context_cache == 300


def test_secrets_never_show_in_the_settings_repr() -> None:
    secrets = ["s3cret-signing", "sk-model-key", "embed-key", "admin-token", "pg-password"]
    dsn = f"postgresql://me:{secrets[4]}@db/stillhere"
    settings = _parse(
        [
            "--secret", secrets[0], "--llm-key", secrets[1], "--embed-key", secrets[2],
            "--admin-token", secrets[3], "--db", dsn,
        ]
    )  # fmt: skip
    assert settings.llm_key == secrets[1]
    shown = repr(settings)
    assert "admin_host" in shown
    assert not [s for s in secrets if s in shown]


def test_the_analysis_model_defaults_to_the_chat_model_and_its_key_is_hidden(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _parse([])
    assert (settings.analysis_url, settings.analysis_model, settings.analysis_key) == (None,) * 3
    assert settings.analysis_timeout == 2.0
    assert (settings.reply_candidates, settings.reply_horizon) == (8, 48 * 3600)
    chosen = _parse(["--analysis-key", "sk-judge", "--analysis-timeout", "500ms"])
    assert chosen.analysis_timeout == 0.5 and "sk-judge" not in repr(chosen)
    monkeypatch.setenv("STILLHERE_ANALYSIS_KEY", "sk-judge-env")
    parser = argparse.ArgumentParser()
    add_options(parser)
    assert "sk-judge-env" not in parser.format_help()
    with pytest.raises(SystemExit):
        _parse(["--analysis-timeout", "0"])
    assert "above 0" in capsys.readouterr().err


def test_a_dsn_is_shown_without_its_password() -> None:
    from transport.config import without_password

    assert without_password("postgresql://u:pw-1@db:5432/x?sslmode=require") == (
        "postgresql://u:***@db:5432/x?sslmode=require"
    )
    assert without_password("postgresql:///x?host=/tmp") == "postgresql:///x?host=/tmp"


def test_sizes_take_units_and_bad_ones_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert _parse([]).limits.link_buffer == 1 << 20
    assert _parse(["--link-buffer", "64KiB"]).limits.link_buffer == 65536
    assert _parse(["--max-frame-bytes", "1MiB"]).limits.max_frame_bytes == 1 << 20
    assert _parse(["--socket-send-buffer", "0"]).limits.socket_send_buffer == 0
    for option, bad, says in (
        ("--link-buffer", "0", "a size in bytes of at least 1"),
        ("--link-buffer", "1 MB", "not a size"),
        ("--socket-send-buffer", "-1", "not a size"),
    ):
        with pytest.raises(SystemExit):
            _parse([option, bad])
        assert says in capsys.readouterr().err


def test_a_bad_value_in_the_environment_is_an_option_error_of_serve_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Read when `serve` parses its options, not when the parser is built: another command
    goes on, and `serve` stops with the option's reason (not a traceback)."""
    from cli.main import main

    monkeypatch.setenv("STILLHERE_LOG_FORMAT", "xml")
    monkeypatch.setenv("STILLHERE_SECRET", "a-signing-secret-of-32-bytes-or-more")
    assert main(["token", "someone"]) == 0
    with pytest.raises(SystemExit) as stopped:
        main(["serve"])
    assert stopped.value.code == 2
    assert "--log-format: invalid choice: 'xml'" in capsys.readouterr().err
    assert _parse(["--log-format", "json"]).log_format == "json"  # the command line wins


def test_a_persona_file_is_read_once_whether_named_by_option_or_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ada = tmp_path / "ada.toml"
    ada.write_text('name = "Ada"\nwarmth = 0.25\n', encoding="utf-8")
    monkeypatch.setenv("STILLHERE_PERSONA", str(tmp_path / "never-read.toml"))
    assert _parse(["--persona", str(ada)]).persona == Persona("Ada", warmth=0.25)
    monkeypatch.setenv("STILLHERE_PERSONA", str(ada))
    parser = argparse.ArgumentParser()
    add_options(parser)
    args = parser.parse_args([])
    ada.unlink()  # read by the parse, and by nothing after it
    assert settings_from(args).persona == Persona("Ada", warmth=0.25)


@pytest.mark.parametrize(
    "command",
    [
        ["serve"],
        ["db"],
        ["cluster"],
        ["token", "someone"],
        ["revoke", "someone"],
        ["memory", "consolidate"],
        ["memory", "search", "cats", "--person", "p"],
    ],
)
def test_every_command_takes_its_data_folder_as_data_dir(command: list[str]) -> None:
    from cli.main import _parser

    assert _parser().parse_args([*command, "--data-dir", "here"]).data_dir == Path("here")
    assert _parser().parse_args(command).data_dir == Path(".stillhere")


@pytest.mark.parametrize("command", ["db", "cluster"])
def test_db_and_cluster_still_take_data(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli.main import _parser

    assert _parser().parse_args([command, "--data", "there"]).data_dir == Path("there")
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        _parser().parse_args([command, "--help"])
    shown = capsys.readouterr().out
    assert "--data-dir" in shown and "--data " not in shown  # the old spelling, unlisted
