"""eagle3.toml parsing: the documented example loads; every mistake names its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tui.services.config import ConfigError, load_config, parse_config

EXAMPLE = """
[host]
target = "root@gpu-box"
python = "/opt/venv/bin/python"
[run]
name = "kimi-extract"
command = ["python", "extract.py", "--tp", "8"]
cwd = "/srv/extract"
env = { VLLM_LOGGING_LEVEL = "INFO" }
match = "02_extract"
log = "/srv/extract/extract.log"
graces = [5, 15]
[patches]
set = "speculators-0.3.0-vllm-0.16"
"""


def test_example_parses() -> None:
    cfg = parse_config(EXAMPLE)
    assert cfg.host.target == "root@gpu-box"
    assert cfg.host.python == "/opt/venv/bin/python"
    assert cfg.run.command == ("python", "extract.py", "--tp", "8")
    assert cfg.run.env == {"VLLM_LOGGING_LEVEL": "INFO"}
    assert cfg.run.graces == (5.0, 15.0)
    assert cfg.patches.set == "speculators-0.3.0-vllm-0.16"


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None)
    assert cfg.host.target is None and cfg.host.python is None and cfg.path is None


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[host]\ntarget = 3\n", "host.target: must be a string, not int"),
        ("[host]\ntarget = \"\"\n", "host.target: must not be empty"),
        ("[host]\npython = \"\"\n", "host.python: must not be empty"),
        ("[run]\ncommand = \"python x.py\"\n",
         "run.command: must be a list of strings (an argv, not a shell line), not str"),
        ("[run]\ncommand = [\"python\", 3]\n", "run.command: must be a list of strings"),
        ("[run]\nenv = { A = 1 }\n", "run.env: must be a table of strings"),
        ("[run]\ngraces = [1]\n", "run.graces: must be two numbers of seconds"),
        ("[run]\ngraces = [1, -1]\n", "run.graces: must be between 0 and 3600"),
        ("[host]\ninterval = -1\n", "host.interval: must be between 0.05 and 3600"),
        ("[host]\ninterval = nan\n", "host.interval: must be a number of seconds"),
        ("[host]\ninterval = \"1\"\n", "host.interval: must be a number of seconds, not str"),
        ("[host]\ninterval = true\n", "host.interval: must be a number of seconds, not bool"),
        ("[host]\ninterval = 0.01\n", "host.interval: must be between 0.05 and 3600"),
        ("host = 1\n", "host: must be a table"),
        ("[host\n", "not valid TOML"),
    ],
)
def test_mistakes_name_the_key(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "eagle3.toml")
    msg = str(err.value)
    assert msg == f"eagle3.toml: {needle}" or needle in msg, msg
    assert "\n" not in msg and msg.startswith("eagle3.toml: ")


@pytest.mark.parametrize(
    "text, warning",
    [
        ("[run]\nnmae = \"x\"\n", "eagle3.toml: unknown key run.nmae ignored (did you mean run.name?)"),
        ("[hots]\n", "eagle3.toml: unknown section [hots] ignored (did you mean [host]?)"),
        ("[host]\nzzz = 1\n", "eagle3.toml: unknown key host.zzz ignored (known: host.target, "
         "host.python, host.runs_dir, host.interval, host.connect_timeout, host.keepalive)"),
    ],
)
def test_unknown_keys_warn_with_the_closest_known_key(text: str, warning: str) -> None:
    cfg = parse_config(text, "eagle3.toml")
    assert cfg.warnings == (warning,)
    assert cfg.run.name == "run"  # the misspelt key did not set anything


def test_launch_without_a_command_is_a_config_error() -> None:
    cfg = parse_config("[run]\nname = \"x\"\n", "eagle3.toml")  # monitoring only: loads
    with pytest.raises(ConfigError) as err:
        cfg.require_command()
    assert str(err.value) == "eagle3.toml: run.command: required (a list of strings)"
    assert parse_config("[run]\ncommand = [\"a\"]\n").require_command() == ("a",)


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
