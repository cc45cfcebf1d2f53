"""Team secrets: stored encrypted per team (``store``), and taken out of what their runs give back (``Redactor``,
applied by ``redact_result`` and ``redacting_sink``)."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.secrets.redactor": ["PLACEHOLDER", "Redactor", "forms_of"],
    "worker.secrets.results": ["IDENTITY_FIELDS", "redact_result", "redacting_sink"],
    "worker.secrets.store": ["FileSecretStore", "MAX_VALUE_BYTES", "MIN_VALUE_BYTES", "RedisSecretStore",
                             "SecretBox", "SecretInfo", "SecretStore", "attach_secrets", "box_from",
                             "forget_secrets"],
})
