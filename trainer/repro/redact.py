"""What legato may write of environment variables, command lines, configs and log text: secrets never.

The environment is captured by **allowlist**: values are recorded only for
the variables that matter for reproduction (`ENV_ALLOWLIST`: PATH, LD_*,
CUDA_*, NCCL_*, TORCH_*, OMP_*, PYTHON*, SLURM_* job geometry, locale, the
variables legato and its launchers set, ...) and for `repro.allow`. Every
other variable is recorded by name with a keyed fingerprint of its value
(HMAC-SHA256 with a random key kept in the run directory): not reversible
without the key, stable within the run directory, so `repro diff` can still
say "changed". Guessing secrets by name and format cannot keep up with the
formats that exist, so it is only the second line: an allowlisted value whose
name looks secret or that contains a known secret format is fingerprinted too.

Command lines and config strings are free text; there the second line is all
there is: names that look secret, known token formats, URLs with userinfo or
token-like query parameters, `key=value` pairs with secret-looking keys, and
high-entropy tokens are replaced by a marker that says why. This module must
never log or return a secret it recognised.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from legato.paths import FINGERPRINT_KEY

if TYPE_CHECKING:
    from legato.config import Config

# -- the environment allowlist -------------------------------------------------------

ENV_ALLOWLIST = (
    # where programs and libraries come from
    "PATH",
    "LD_*",
    "LIBRARY_PATH",
    "CPATH",
    "PYTHON*",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "CONDA_SHLVL",
    "LOADEDMODULES",
    "MODULEPATH",
    "_LMFILES_",
    "MODULESHOME",
    "LMOD_CMD",
    "LMOD_VERSION",
    # accelerators, collectives, numerics, threads
    "CUDA_*",
    "CUDNN_*",
    "CUBLAS_*",
    "CUBLASLT_*",
    "NCCL_*",
    "NVIDIA_*",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "TORCH_*",
    "TORCHINDUCTOR_*",
    "PYTORCH_*",
    "ATEN_*",
    "OMP_*",
    "MKL_*",
    "OPENBLAS_*",
    "KMP_*",
    "GOMP_*",
    "TOKENIZERS_PARALLELISM",
    # SLURM job geometry (not free text such as the job's comment)
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NNODES",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_CPUS_PER_TASK",
    "SLURM_CPUS_ON_NODE",
    "SLURM_JOB_CPUS_PER_NODE",
    "SLURM_GPUS*",
    "SLURM_JOB_GPUS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_MEM_PER_*",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_NODEID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_RESTART_COUNT",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_QOS",
    "SLURM_JOB_ACCOUNT",
    "SLURM_CLUSTER_NAME",
    "SLURM_ARRAY_*",
    "SLURM_STEP_*",
    "SLURM_STEPID",
    "SLURM_TASK_PID",
    "SLURM_DISTRIBUTION",
    "SLURM_CPU_BIND*",
    "SLURM_TOPOLOGY_ADDR*",
    "SLURMD_NODENAME",
    "SLURM_SUBMIT_HOST",
    "SLURM_JOB_START_TIME",
    "SLURM_JOB_END_TIME",
    "SLURM_GTIDS",
    "SLURM_SRUN_COMM_PORT",
    "SLURM_STEP_LAUNCHER_PORT",
    "SLURM_LAUNCH_NODE_IPADDR",
    "SLURM_SUBMIT_DIR",
    "SLURM_SCRIPT_CONTEXT",
    "SLURM_JOB_UID",
    "SLURM_JOB_USER",
    "SLURM_JOB_NAME",
    # host, user, shell, locale
    "HOSTNAME",
    "HOST",
    "USER",
    "LOGNAME",
    "HOME",
    "SHELL",
    "PWD",
    "OLDPWD",
    "TMPDIR",
    "TERM",
    "SHLVL",
    "_",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMUX_PANE",
    "TERM_SESSION_ID",
    "SSH_TTY",
    # what legato and its launchers set
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LEGATO_*",
    "SUBMITIT_*",
)

# Never recorded, not even by `repro.allow`: the end hook's command (legato.orchestrator.end_hook) carries a webhook's
# token, and LEGATO_* is allowlisted above.
NOTIFY_ENV = "LEGATO_NOTIFY_COMMAND"
NEVER_RECORDED = (NOTIFY_ENV,)

# -- second line: names and formats -----------------------------------------------------

SECRET_WORDS = {
    "token",
    "tokens",
    "secret",
    "secrets",
    "password",
    "passwords",
    "passwd",
    "pass",
    "passphrase",
    "pwd",
    "key",
    "keys",
    "apikey",
    "credential",
    "credentials",
    "creds",
    "auth",
    "cookie",
    "cookies",
    "session",
    "private",
    "signature",
    "sig",
    "dsn",
    "webhook",
    "bearer",
    "sas",
    "connstr",
}
SECRET_FRAGMENTS = (
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "credential",
    "privatekey",
    "accesskey",
    "accountkey",
    "webhook",
    "connectionstring",
)
# Names that contain a secret-looking word but hold nothing secret.
NOT_SECRET = {"TOKENIZERS_PARALLELISM", "SSH_AUTH_SOCK", "PWD", "OLDPWD", "KEYBOARD"}

VALUE_PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple(
    (why, re.compile(pattern, flags))
    for why, pattern, flags in (
        ("a private key block", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----[\s\S]*?(-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|$)", 0),
        ("a GitHub token", r"\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})", 0),
        ("a GitLab token", r"\bgl(pat|ptt|dt|rt|cbt|oas|imt)-[A-Za-z0-9_-]{20,}", 0),
        ("a Hugging Face token", r"\bhf_[A-Za-z0-9]{30,}", 0),
        ("an AWS access key", r"\b(AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b", 0),
        ("a Slack token", r"\bxox[abposre]-[A-Za-z0-9-]{10,}", 0),
        ("a Slack webhook", r"hooks\.slack\.com/(services|workflows|triggers)/[A-Za-z0-9/_-]+", 0),
        ("a Discord webhook", r"discord(app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_-]+", 0),
        ("a Teams webhook", r"(outlook\.office\.com|webhook\.office\.com)/webhook[A-Za-z0-9/@_.-]+", 0),
        ("an OpenAI-style key", r"\bsk-[A-Za-z0-9_-]{20,}", 0),
        ("a Stripe key", r"\b(sk|rk|pk)_(live|test)_[A-Za-z0-9]{10,}|\bwhsec_[A-Za-z0-9]{20,}", 0),
        ("an npm token", r"\bnpm_[A-Za-z0-9]{30,}", 0),
        ("a PyPI token", r"\bpypi-AgE[A-Za-z0-9_-]{20,}", 0),
        ("a Google API key", r"\bAIza[0-9A-Za-z_-]{30,}", 0),
        ("a Google OAuth secret or token", r"\bGOCSPX-[A-Za-z0-9_-]{20,}|\bya29\.[A-Za-z0-9_-]{20,}", 0),
        ("a JWT", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", 0),
        ("a SendGrid key", r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}", 0),
        ("a Twilio key", r"\b(SK|AC)[0-9a-fA-F]{32}\b", 0),
        ("a Mailgun key", r"\bkey-[0-9a-fA-F]{32}\b", 0),
        ("a Databricks token", r"\bdapi[0-9a-f]{32}\b", 0),
        ("a DigitalOcean token", r"\bdo[opr]_v1_[0-9a-f]{64}\b", 0),
        ("a Docker Hub token", r"\bdckr_pat_[A-Za-z0-9_-]{20,}", 0),
        ("a Shopify token", r"\bshp(at|ss|ca|pa)_[0-9a-fA-F]{32}\b", 0),
        ("a Telegram bot token", r"\b[0-9]{8,10}:AA[A-Za-z0-9_-]{30,}", 0),
        ("an age secret key", r"\bAGE-SECRET-KEY-1[0-9A-Z]{50,}", 0),
        ("a Vault token", r"\bhv[sbr]\.[A-Za-z0-9_-]{20,}", 0),
        ("an Atlassian token", r"\bATATT[A-Za-z0-9_=-]{20,}", 0),
        ("a Grafana or New Relic key", r"\b(glsa|glc)_[A-Za-z0-9_=+/-]{20,}|\bNRAK-[A-Z0-9]{20,}", 0),
        ("an authorization header", r"\b(?i:Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{12,}", 0),
    )
)
SECRET_HINTS = ("pass", "pwd", "secret", "token", "key", "credential", "authorization", "signature", "webhook", "dsn")
# Every pattern here runs in linear time on hostile text (megabytes of git diff or `a.a.a...`): quantifiers
# that could backtrack over each other are bounded, and assignments are found from their keyword outward.
URL_USERINFO = re.compile(r"://(?P<user>[^\s:/@?#]{0,256})(?P<colon>:?)(?P<password>[^\s@/?#]{0,256})@")
URL_QUERY = re.compile(r"(?P<sep>[?&;#])(?P<name>[A-Za-z0-9_.\[\]-]{1,64})=(?P<value>[^&#\s\"'<>]+)")
QUERY_SECRETS = {"sig", "code", "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential"}
# key=value, key: value, "key": "value" with a secret-looking key (config fragments, connection strings, JSON).
ASSIGNMENT_KEYWORD = re.compile(
    r"password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|account[_-]?key|private[_-]?key|client[_-]?secret|credential"
    r"|authorization|sharedaccesskey|sharedaccesssignature|signature|webhook|dsn",
    re.I,
)
NAME_REST = re.compile(r"[A-Za-z0-9_.-]*")
ASSIGNED_VALUE = re.compile(
    r"[\"']?[ \t]{0,8}[:=][ \t]{0,8}[\"']?"
    r"(?!<redacted|(?:true|false|null|none|[0-9.]+)\b)(?P<value>[^\s\"',;&}]{4,})",
    re.I,
)
TOKEN = re.compile(r"[A-Za-z0-9+/_-]{20,}={0,2}")
FLAG_WITH_VALUE = re.compile(r"^(?P<flag>--?[A-Za-z0-9_.-]+)=(?P<value>.*)$", re.S)
# Config keys whose values name things legato itself uses (paths, modules): never judged by entropy.
STRUCTURAL_KEYS = {
    "run.name",
    "run.dir",
    "train.entrypoint",
    "train.task",
    "executor",
    "slurm.partition",
    "slurm.account",
    "slurm.qos",
    "slurm.signal",
}


def marker(why: str) -> str:
    """The text written in place of a value withheld for the reason `why`."""
    return f"<redacted: {why}>"


def fingerprint_line(key: bytes, value: str) -> str:
    """The text written in place of `value`: its keyed fingerprint (the first 16 hex digits of an HMAC-SHA256)."""
    digest = hmac.new(key, value.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()[:16]
    return f"<not recorded: fingerprint {digest}>"


def is_fingerprint(value: str) -> bool:
    """Whether `value` is a fingerprint written by `fingerprint_line`."""
    return value.startswith("<not recorded: fingerprint ")


def key_id(key: bytes) -> str:
    """Names a fingerprint key without revealing it: captures with the same id can compare fingerprints."""
    return hmac.new(key, b"legato fingerprint key id", hashlib.sha256).hexdigest()[:12]


def run_key(directory: Path) -> bytes:
    """The fingerprint key kept in `directory` (created once, readable by its owner only); every capture under it shares it."""
    path = Path(directory) / FINGERPRINT_KEY
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{FINGERPRINT_KEY}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        try:
            os.link(tmp, path)  # atomic and never replaces: the first of several racing nodes wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return bytes.fromhex(path.read_text().strip())


def _matches(name: str, patterns: Any) -> bool:
    return any(fnmatch.fnmatchcase(name.upper(), str(p).upper()) for p in patterns)


def looks_random(token: str) -> bool:
    """A high-entropy token: mixed-case letters and digits, nearly every character distinct (words and
    CamelCase names repeat letters), or a long hex string. Thresholds after detect-secrets' base64 rule."""
    if len(token) < 20 or token.startswith(("/", "./", "~/")):
        return False
    stripped = token.strip("=")
    if re.fullmatch(r"[0-9a-f]{32,}|[0-9A-F]{32,}", stripped) and re.search(r"[a-fA-F]", stripped) and re.search(r"[0-9]", stripped):
        return True
    classes = [("u" if c.isupper() else "l" if c.islower() else "d" if c.isdigit() else "p") for c in stripped]
    if not {"u", "l", "d"} <= set(classes):
        return False
    wordlike = sum(len(run) for run in re.findall(r"[a-z]{4,}|[A-Z][a-z]{3,}", stripped)) / len(stripped)
    if wordlike > 0.3:  # CamelCase names and words with digits: readable, not random
        return False
    changes = sum(a != b for a, b in zip(classes, classes[1:])) / max(1, len(classes) - 1)
    counts = Counter(stripped)
    entropy = -sum(n / len(stripped) * math.log2(n / len(stripped)) for n in counts.values())
    return changes >= 0.3 and entropy >= min(4.5, 0.88 * math.log2(len(stripped)))


@dataclass(frozen=True)
class Redactor:
    """Decides what may be recorded: names, values and text with secrets withheld, per the allow and deny lists and a fingerprint key."""

    allow: frozenset[str] = field(default_factory=frozenset)
    deny: tuple[str, ...] = ()
    key: bytes = field(default_factory=lambda: os.urandom(32), repr=False)

    @classmethod
    def from_config(cls, cfg: Config, key: bytes | None = None) -> Redactor:
        """The redactor built from the config: its `repro.allow` and `repro.deny`, and the run directory's key when given."""
        extra = {} if key is None else {"key": key}
        return cls(frozenset(cfg.repro.allow), tuple(cfg.repro.deny), **extra)

    # -- names

    def name_is_secret(self, name: str) -> bool:
        if self._allowed(name) or name.upper() in NOT_SECRET:
            return False
        if _matches(name, self.deny):
            return True
        words = set(re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()))
        squashed = re.sub(r"[^a-z0-9]", "", name.lower())
        return bool(words & SECRET_WORDS) or any(fragment in squashed for fragment in SECRET_FRAGMENTS)

    def _allowed(self, name: str) -> bool:
        return name in self.allow or _matches(name, self.allow)

    # -- the environment

    def environ(self, env: dict[str, str]) -> dict[str, str]:
        """Each variable's value if it may be recorded, else its keyed fingerprint."""
        return {name: self.env_value(name, value) for name, value in sorted(env.items())}

    def env_value(self, name: str, value: str) -> str:
        if name in NEVER_RECORDED:
            return fingerprint_line(self.key, value)
        listed = self._allowed(name) or (_matches(name, ENV_ALLOWLIST) and not _matches(name, self.deny))
        if listed and not self.name_is_secret(name) and self.words(value) == value:
            return value
        return fingerprint_line(self.key, value)

    # -- free text

    def value(self, name: str, value: str) -> str:
        """A named value (a config key, a flag) as it may be written."""
        if self.name_is_secret(name) and value != "":
            return marker("the name looks secret")
        return self.text(value)

    def text(self, text: str) -> str:
        """Log or output text with every known secret format, credential URL part and secret-looking assignment replaced."""
        for why, pattern in VALUE_PATTERNS:
            text = pattern.sub(marker(f"looks like {why}"), text)
        text = URL_USERINFO.sub(self._userinfo, text)
        text = URL_QUERY.sub(self._query, text)
        return _assignments(text)

    def words(self, text: str) -> str:
        """`text` plus high-entropy tokens: for command lines and config strings, where a bare token is likely a credential."""
        text = self.text(text)
        return TOKEN.sub(lambda m: marker("looks like a random token") if looks_random(m[0]) else m[0], text)

    def _userinfo(self, m: re.Match) -> str:
        if m["colon"]:
            password = m["password"] if m["password"].startswith("<redacted") else marker("URL password")
            return f"://{m['user']}:{password}@"
        if len(m["user"]) >= 12 or looks_random(m["user"]):
            return f"://{marker('URL credentials')}@"
        return m[0]

    def _query(self, m: re.Match) -> str:
        name = m["name"]
        if m["value"].startswith("<redacted") or not (self.name_is_secret(name) or name.lower() in QUERY_SECRETS):
            return m[0]
        return f"{m['sep']}{name}={marker('URL parameter')}"

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
            key, sep, _ = arg.partition("=")
            if flag and self.name_is_secret(flag["flag"].lstrip("-")):
                out.append(f"{flag['flag']}={marker('the name looks secret')}")
            elif sep and not arg.startswith("-") and self.name_is_secret(key.rsplit(".", 1)[-1]):
                out.append(f"{key}={marker('the name looks secret')}")
            elif arg.startswith("-") and not sep and self.name_is_secret(arg.lstrip("-")):
                out.append(arg)
                secret_next = True
            elif sep and not arg.startswith("-") and key in STRUCTURAL_KEYS:
                out.append(f"{key}={self.text(arg[len(key) + 1 :])}")
            else:
                out.append(self.words(arg))
        return out

    def tree(self, data: Any, name: str = "", path: str = "") -> Any:
        """A nested config (dicts, lists, scalars): string values redacted by their key or their content."""
        if isinstance(data, dict):
            return {self._key(k, data): self.tree(v, str(k), f"{path}{k}.") for k, v in data.items()}
        if isinstance(data, list):
            return [self.tree(v, name, path) for v in data]
        if isinstance(data, str):
            judged = self.value(name, data)
            return judged if path.rstrip(".") in STRUCTURAL_KEYS else self.words(judged)
        if name and self.name_is_secret(name) and data not in (None, False, True, 0):
            return marker("the name looks secret")
        return data

    def _key(self, key: Any, mapping: dict) -> Any:
        """A mapping key judged like a value (a token used as a key is as secret); a redacted key that would
        collide with another key of the same mapping is numbered, so no entry silently replaces another."""
        if not isinstance(key, str):
            return key
        judged = self.words(key)
        if judged == key:
            return key
        earlier = [other for other in mapping if isinstance(other, str) and other < key]
        clashes = sum(1 for other in earlier if self.words(other) == judged)
        return judged if clashes == 0 else f"{judged} #{clashes + 1}"


def _assignments(text: str) -> str:
    """`text` with the value of every `name=value` / `name: value` whose name holds a secret keyword replaced."""
    lowered = text.lower()
    if not any(hint in lowered for hint in SECRET_HINTS):
        return text
    out: list[str] = []
    pos = skip = 0
    for m in ASSIGNMENT_KEYWORD.finditer(text):
        if m.start() < skip:
            continue
        rest = NAME_REST.match(text, m.end())
        assert rest is not None  # NAME_REST matches the empty string too
        skip = rest.end()  # one scan per name, however many keywords it holds
        assigned = ASSIGNED_VALUE.match(text, skip)
        if assigned:
            out += [text[pos : assigned.start("value")], marker("the name looks secret")]
            pos = skip = assigned.end()
    return "".join(out) + text[pos:]
