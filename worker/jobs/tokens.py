"""The workers' token (``SKILLRUN_WORKER_TOKEN``): what the API and the workers accept as one, checked the same way
by both planes' settings."""

from __future__ import annotations

from pydantic import SecretStr


def usable_worker_token(value: SecretStr | None) -> SecretStr | None:
    """The workers' token as both planes accept it: 24 or more visible ASCII characters (no space or line end, which
    an HTTP header cannot carry and a secret made with ``echo`` or ``--from-file`` often ends with)."""
    if value is not None:
        token = value.get_secret_value()
        if len(token) < 24 or not all("!" <= c <= "~" for c in token):
            raise ValueError("the worker token must be 24 or more visible ASCII characters, no spaces or line ends "
                             "(for example: openssl rand -hex 32)")
    return value
