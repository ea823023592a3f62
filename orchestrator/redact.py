"""Secret redaction for everything legato writes: environment variables, command lines, configs, ledger text.

A value is redacted when its name looks secret (token, secret, password, key,
credential, auth, cookie, session, ...) or the value itself looks like a known
secret format (GitHub, Hugging Face, AWS, Slack and OpenAI-style keys, JWTs,
private key blocks, URLs with a password). Redaction keeps the name and says
why, so a reader sees that something was there. A per-run allow list (names
never redacted) and deny list (extra name patterns always redacted) adjust
the rules. This module must never log or return a secret it recognised.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

SECRET_WORDS = {
    "token", "tokens", "secret", "secrets", "password", "passwords", "passwd", "pass", "passphrase", "key", "keys",
    "apikey", "credential", "credentials", "creds", "auth", "cookie", "cookies", "session", "private", "signature", "dsn",
}
SECRET_FRAGMENTS = ("password", "passwd", "secret", "token", "apikey", "credential", "privatekey", "accesskey")
ALWAYS_ALLOWED = {"TOKENIZERS_PARALLELISM", "SSH_AUTH_SOCK"}

VALUE_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("a private key block", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)", re.S)),
    ("a GitHub token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("an AWS access key", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("an OpenAI-style key", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")),
    ("a JWT", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
)
URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]+:)(?P<password>[^\s@/]+)(?P<at>@)")
FLAG_WITH_VALUE = re.compile(r"^(?P<flag>--?[A-Za-z0-9_.-]+)=(?P<value>.*)$", re.S)


def marker(why: str) -> str:
    return f"<redacted: {why}>"


@dataclass(frozen=True)
class Redactor:
    allow: frozenset[str] = field(default_factory=frozenset)
    deny: tuple[str, ...] = ()

    def name_is_secret(self, name: str) -> bool:
        if name in self.allow or name in ALWAYS_ALLOWED:
            return False
        if any(fnmatch.fnmatchcase(name.upper(), pattern.upper()) for pattern in self.deny):
            return True
        lowered = name.lower()
        words = set(re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()))
        squashed = re.sub(r"[^a-z0-9]", "", lowered)
        return bool(words & SECRET_WORDS) or any(fragment in squashed for fragment in SECRET_FRAGMENTS)

    def value(self, name: str, value: str) -> str:
        """A named value (an environment variable, a config key) as it may be written."""
        if self.name_is_secret(name) and value != "":
            return marker("the name looks secret")
        return self.text(value)

    def text(self, text: str) -> str:
        """Free text with every secret-looking substring replaced."""
        for why, pattern in VALUE_PATTERNS:
            text = pattern.sub(marker(f"looks like {why}"), text)
        return URL_PASSWORD.sub(lambda m: m["head"] + marker("URL password") + m["at"], text)

    def environ(self, env: dict[str, str]) -> dict[str, str]:
        return {name: self.value(name, value) for name, value in sorted(env.items())}

    def argv(self, argv: list[str]) -> list[str]:
        """A command line: `--token=X`, `--token X` and `key=value` overrides whose key looks secret lose their value."""
        out: list[str] = []
        secret_next = False
        for arg in argv:
            if secret_next:
                out.append(marker("follows a secret-looking flag"))
                secret_next = False
                continue
            flag = FLAG_WITH_VALUE.match(arg)
            key, sep, value = arg.partition("=")
            if flag and self.name_is_secret(flag["flag"].lstrip("-")):
                out.append(f"{flag['flag']}={marker('the name looks secret')}")
            elif sep and not arg.startswith("-") and self.name_is_secret(key.rsplit(".", 1)[-1]):
                out.append(f"{key}={marker('the name looks secret')}")
            elif arg.startswith("-") and not sep and self.name_is_secret(arg.lstrip("-")):
                out.append(arg)
                secret_next = True
            else:
                out.append(self.text(arg))
        return out

    def tree(self, data: Any, name: str = "") -> Any:
        """A nested config (dicts, lists, scalars): string values redacted by their key or their content."""
        if isinstance(data, dict):
            return {k: self.tree(v, str(k)) for k, v in data.items()}
        if isinstance(data, list):
            return [self.tree(v, name) for v in data]
        if isinstance(data, str):
            return self.value(name, data)
        if name and self.name_is_secret(name) and data not in (None, False, True, 0):
            return marker("the name looks secret")
        return data
