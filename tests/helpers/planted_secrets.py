"""The secrets tests plant: over thirty formats of credentials, each with the part that must never be found.

Also the environment the repro tests plant (REPRO_SECRETS). Shared by unit/test_secrets.py (the redactor on each format)
and e2e/test_secrets_run.py (a real run with all of them planted).
The values are random but fixed by the seed, so the two modules plant the same ones.
"""

from __future__ import annotations

import json
import random
import string

from legato.repro.redact import looks_random

_rnd = random.Random(15)


def _rand(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    while True:
        text = "".join(_rnd.choice(alphabet) for _ in range(n))
        if n < 20 or alphabet != string.ascii_letters + string.digits or looks_random(text):
            return text


HEX = "0123456789abcdef"

# name -> (the value as planted, the part that is secret and must never be found)
FORMATS: dict[str, tuple[str, str]] = {}


def _plant(name: str, value: str, secret: str | None = None) -> None:
    FORMATS[name] = (value, secret or value)


_plant("github_classic", "ghp_" + _rand(36))
_plant("github_fine_grained", "github_pat_11ABCDEFG0" + _rand(59))
_plant("gitlab", "glpat-" + _rand(20))
_plant("hugging_face", "hf_" + _rand(34))
_plant("aws_access_key", "AKIA" + _rand(16, string.ascii_uppercase + string.digits))
_secret = _rand(40)
_plant("aws_secret_key", _secret[:13] + "/" + _secret[13:20] + "/" + _secret[20:])
_plant("slack_bot_token", "xoxb-2401234567-" + _rand(24))
_hook = _rand(24)
_plant("slack_webhook", f"https://hooks.slack.com/services/T024BE7LD/B01ABCDEF/{_hook}", _hook)
_discord = _rand(60, string.ascii_letters + string.digits + "_-")
_plant("discord_webhook", f"https://discord.com/api/webhooks/112233445566778899/{_discord}", _discord)
_plant("openai", "sk-proj-" + _rand(40))
_plant("anthropic", "sk-ant-api03-" + _rand(40))
_plant("stripe_live", "sk_live_" + _rand(24))
_plant("stripe_restricted", "rk_live_" + _rand(24))
_plant("stripe_webhook_secret", "whsec_" + _rand(32))
_plant("npm", "npm_" + _rand(36))
_plant("pypi", "pypi-AgEIcHlwaS5vcmc" + _rand(50))
_account_key = _rand(64) + "=="
_plant(
    "azure_connection_string",
    f"DefaultEndpointsProtocol=https;AccountName=legatostore;AccountKey={_account_key};EndpointSuffix=core.windows.net",
    _account_key,
)
_sas = _rand(43) + "%3D"
_plant("azure_sas_url", f"https://legatostore.blob.core.windows.net/ckpt/a.pt?sv=2021-06-08&sr=b&sp=r&sig={_sas}", _sas)
_query_token = _rand(32)
_plant("url_token_query", f"https://data.example.org/v1/shards?split=train&token={_query_token}", _query_token)
_access_token = _rand(28)
_plant("url_access_token", f"https://api.example.org/export?access_token={_access_token}&format=csv", _access_token)
_password = "Tr0ub4dor&3-horse"
_plant("url_password", f"postgres://trainer:{_password}@db.example.org:5432/runs", _password)
_mongo = _rand(18)
_plant("mongodb_srv", f"mongodb+srv://legato:{_mongo}@cluster0.example.mongodb.net/db", _mongo)
_git_token = "ghs_" + _rand(36)
_plant("git_url_token", f"https://x-access-token:{_git_token}@github.com/org/repo.git", _git_token)
_key_id = "".join(_rnd.choice(HEX) for _ in range(40))
_plant("gcp_private_key_id", json.dumps({"type": "service_account", "project_id": "legato-test", "private_key_id": _key_id}), _key_id)
_plant("gcp_api_key", "AIza" + _rand(35))
_plant("google_oauth_secret", "GOCSPX-" + _rand(28))
_plant("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0." + _rand(43))
_pem_body = _rand(64)
_plant("rsa_private_key", f"-----BEGIN RSA PRIVATE KEY-----\n{_pem_body}\n-----END RSA PRIVATE KEY-----", _pem_body)
_ssh_body = _rand(70)
_plant("openssh_private_key", f"-----BEGIN OPENSSH PRIVATE KEY-----\n{_ssh_body}\n-----END OPENSSH PRIVATE KEY-----", _ssh_body)
_plant("sendgrid", "SG." + _rand(22) + "." + _rand(43))
_plant("twilio", "SK" + "".join(_rnd.choice(HEX) for _ in range(32)))
_plant("mailgun", "key-" + "".join(_rnd.choice(HEX) for _ in range(32)))
_plant("databricks", "dapi" + "".join(_rnd.choice(HEX) for _ in range(32)))
_plant("digitalocean", "dop_v1_" + "".join(_rnd.choice(HEX) for _ in range(64)))
_plant("dockerhub", "dckr_pat_" + _rand(27))
_plant("shopify", "shpat_" + "".join(_rnd.choice(HEX) for _ in range(32)))
_plant("telegram_bot", "5712345678:AA" + _rand(33))
_bearer = _rand(32)
_plant("bearer_header", f"Authorization: Bearer {_bearer}", _bearer)
_plant("age_secret_key", "AGE-SECRET-KEY-1" + _rand(58, string.ascii_uppercase + string.digits))
_plant("vault", "hvs." + _rand(24))
_plant("datadog_hex_key", "".join(_rnd.choice(HEX) for _ in range(32)))
_plant("generic_random_token", _rand(32))

# Allowlisted names (values normally recorded): the second line must still hold them back.
ALLOWLISTED_PLANTS = {
    "TORCH_HUB_TOKEN": FORMATS["hugging_face"][0],
    "CUDA_LEGATO_PROBE": FORMATS["url_token_query"][0],
    "PYTHON_LEGATO_PROBE": FORMATS["stripe_live"][0],
    "NCCL_LEGATO_PROBE": FORMATS["azure_connection_string"][0],
    "LC_LEGATO_PROBE": FORMATS["npm"][0],
}
SECRETS = sorted({secret for _, secret in FORMATS.values()})

# The environment a repro test plants, and every part of it (and of its command line and config) that is secret.
REPRO_SECRETS = {
    "GITHUB_TOKEN": "ghp_" + "A1b2C3d4E5f6G7h8I9j0" * 2,
    "MY_SETTING": "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNm1234",
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "NOTIFY_HOOK": "xoxb-123456789012-abcdefABCDEF",
    "OPENAI_API_KEY": "sk-proj-" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2",
    "SOME_HEADER": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "DEPLOY_PEM": "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu\n-----END RSA "
    "PRIVATE KEY-----",
    "DATABASE_URL": "postgres://trainer:hunter2hunter2@db.example.org/runs",
    "MY_PASSWORD": "correct-horse-battery-staple",
}
REPRO_SECRET_VALUES = [
    "A1b2C3d4E5f6G7h8I9j0",
    "QwErTyUiOpAsDfGhJkLzXcVbNm1234",
    "AKIAIOSFODNN7EXAMPLE",
    "123456789012-abcdefABCDEF",
    "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2",
    "dozjgNryP4J3jVmNHl0w5N",
    "MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu",
    "hunter2hunter2",
    "correct-horse-battery-staple",
    "cmdline-secret-value-0042",
    "QQ77config-secret-value",
    "pw-in-config-url-9",
]
