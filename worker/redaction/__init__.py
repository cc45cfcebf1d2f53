"""Redaction: a team's secret values taken out of what its runs give back (``Redactor``, and where it is applied:
``redact_result``, ``redacting_sink``)."""

from worker.redaction.redactor import PLACEHOLDER, Redactor, forms_of
from worker.redaction.results import IDENTITY_FIELDS, redact_result, redacting_sink

__all__ = ["IDENTITY_FIELDS", "PLACEHOLDER", "Redactor", "forms_of", "redact_result", "redacting_sink"]
