"""The redactor of environment captures, in one process: each planted secret is held back by its value or by its
name, names stay readable, and repro.allow and repro.deny adjust the allowlist (real captures: e2e/test_repro.py)."""

from __future__ import annotations

from helpers.planted_secrets import REPRO_SECRETS as SECRETS

from legato.repro.redact import Redactor


def test_redactor_catches_each_format_and_keeps_names() -> None:
    r = Redactor()
    env = r.environ({**SECRETS, "PATH": "/usr/bin", "TOKENIZERS_PARALLELISM": "false", "KEYBOARD": "us", "PWD": "/work"})
    for name in SECRETS:
        assert env[name].startswith("<not recorded: fingerprint "), name
    assert (env["PATH"], env["TOKENIZERS_PARALLELISM"], env["PWD"]) == ("/usr/bin", "false", "/work")
    assert env["KEYBOARD"].startswith("<not recorded"), "not on the allowlist: recorded by name and fingerprint"
    for name, value in SECRETS.items():
        if name != "MY_PASSWORD":  # only its name gives it away
            assert "<redacted" in r.text(value), name
    assert r.text(SECRETS["DATABASE_URL"]) == "postgres://trainer:<redacted: URL password>@db.example.org/runs"
    argv = r.argv(["train.py", "--api-token", "abc123", "--password=xyz789", "train.options.hf_token=plain", "lr=0.1", "--steps", "5"])
    assert argv == [
        "train.py",
        "--api-token",
        "<redacted: follows a secret-looking flag>",
        "--password=<redacted: the name looks secret>",
        "train.options.hf_token=<redacted: the name looks secret>",
        "lr=0.1",
        "--steps",
        "5",
    ]
    adjusted = Redactor(allow=frozenset({"MY_PASSWORD"}), deny=("*_SETTING_X", "CORP_*"))
    assert adjusted.value("MY_PASSWORD", "visible") == "visible"
    assert adjusted.value("CORP_THING", "hidden").startswith("<redacted")


def test_the_end_hooks_command_is_never_recorded_even_when_allowed() -> None:
    """LEGATO_* is allowlisted, and a user may allow a name; the end hook's command (a webhook's token) stays out."""
    command = "curl -d done https://hooks.example/services/T0K3N"
    for redactor in (Redactor(), Redactor(allow=frozenset({"LEGATO_NOTIFY_COMMAND"}))):
        assert "T0K3N" not in redactor.env_value("LEGATO_NOTIFY_COMMAND", command)
    assert Redactor().env_value("LEGATO_RESUME", "required") == "required"  # the contrast: other LEGATO_* values are kept
