"""The one secret scrubber of every script: what a command line, an error message or a run record may not show.

A value is secret when it follows a flag whose name contains token / key / secret / password / auth (however the
flag is spelled: `--hub_token`, `--hubkey`, `--api-key=...`), when it is token-shaped (`hf_...` and the other
providers' prefixes below), or when the caller names it (the parsed secret fields, $HF_TOKEN). A leaf: imports no
torch and no other project module, so every CLI can scrub before anything heavy is loaded.
"""
from __future__ import annotations

import os
import re
from typing import Iterable

MASK = "***"
SECRET_WORDS = ("tok", "key", "secret", "passw", "auth")
SECRET_FIELDS = ("hub_token",)  # the config fields that hold a secret: never written anywhere
# token-shaped values: Hugging Face, GitHub, OpenAI-style, Slack, AWS access key ids
TOKEN_SHAPED = re.compile(r"(?<![\w-])(?:hf_[\w-]+|gh[pousr]_\w{8,}|github_pat_\w{8,}|sk-[\w-]{8,}|xox[abprs]-[\w-]{8,}"
                          r"|AKIA[0-9A-Z]{12,})")
BEARER = re.compile(r"(?i)\b(bearer\s+)(?!\*\*\*)[A-Za-z0-9._~+/=-]+")  # an Authorization header's credential


def looks_secret(flag: str) -> bool:
    """True for a flag whose name says it may carry a secret: --hub_token, --hubkey, --api-key, --db_password, and
    any abbreviation of a secret field (--hub_t)."""
    name = flag.lstrip("-").split("=", 1)[0].lower().replace("-", "_")
    return any(w in name for w in SECRET_WORDS) or any(len(name) >= 3 and f.startswith(name) for f in SECRET_FIELDS)


def secret_values(argv: Iterable[str], extra: Iterable[str | None] = ()) -> list[str]:
    """The secret values in `argv` (those of secret-looking flags), `extra` and $HF_TOKEN, longest first."""
    argv = [str(a) for a in argv]
    values = {os.environ.get("HF_TOKEN", "").strip(), *(str(v).strip() for v in extra if v)}
    for i, a in enumerate(argv):
        if a.startswith("-") and looks_secret(a):
            flag, eq, value = a.partition("=")
            values.add(value if eq else argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else "")
    return sorted((v for v in values if v), key=len, reverse=True)


def scrub_text(text: str, argv: Iterable[str] = (), extra: Iterable[str | None] = ()) -> str:
    """`text` with every secret value of `argv` / `extra` / $HF_TOKEN and every token-shaped string replaced by ***."""
    for v in secret_values(argv, extra):  # a short value only where it stands alone (`a` must not mask every a)
        text = text.replace(v, MASK) if len(v) >= 8 else re.sub(rf"(?<![\w-]){re.escape(v)}(?![\w-])", MASK, text)
    return TOKEN_SHAPED.sub(MASK, BEARER.sub(rf"\1{MASK}", text))


def scrub_argv(argv: Iterable[str], extra: Iterable[str | None] = ()) -> list[str]:
    """`argv` with the value after (or `=` of) each secret-looking flag, the `extra` values, $HF_TOKEN and anything
    token-shaped replaced by ***."""
    argv = [str(a) for a in argv]
    values = secret_values(argv, extra)
    out, hide = [], False
    for a in argv:
        if hide and not a.startswith("--"):
            a = MASK
        hide = False
        if a.startswith("-") and looks_secret(a):
            if "=" in a:
                a = a.split("=", 1)[0] + "=" + MASK
            else:
                hide = True
        for v in values:
            a = a.replace(v, MASK)
        out.append(TOKEN_SHAPED.sub(MASK, a))
    return out


__all__ = ["MASK", "SECRET_FIELDS", "looks_secret", "scrub_argv", "scrub_text", "secret_values"]
