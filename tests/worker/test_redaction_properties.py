"""Properties of redaction on generated hostile input (hypothesis): no form of a secret survives, wrapped at any
width or not; streaming a file in any chunks gives what redacting it whole gives; text holding no secret is
untouched; and the work done is linear in the text — checked by counting (``Redactor.work``: characters read and
compared), not by timing.
"""

from __future__ import annotations

import base64
import re
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.secrets import Redactor, forms_of

WORK_PER_CHARACTER = 64
"""Characters read and compared per character of text and of the forms (a text is read once per view and per
form that repeats itself; each place an anchor is found is compared once per form with that anchor)."""

SECRET_ALPHABET = string.ascii_letters + string.digits + "-_.:/+=@!$%&*~ \"'\\"
SECRETS = st.one_of(
    st.text(SECRET_ALPHABET, min_size=8, max_size=120),
    st.tuples(st.text(SECRET_ALPHABET, min_size=1, max_size=4), st.integers(8, 200)).map(  # repeats itself
        lambda spec: (spec[0] * spec[1])[: max(8, spec[1])]),
    st.text(min_size=8, max_size=40).filter(lambda s: "\0" not in s and s.encode("utf-8", "ignore") == s.encode(
        "utf-8", "surrogatepass")),
)
NOISE = st.text(string.ascii_letters + string.digits + " \n\t+/=", max_size=60)


def _wrapped(text: str, width: int, breaks: str) -> str:
    return breaks.join(text[i:i + width] for i in range(0, len(text), width))


@st.composite
def outputs(draw, secrets: list[str]) -> str:
    """A text mixing noise with the secrets in their forms, some wrapped, some embedded in longer base64."""
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        secret = draw(st.sampled_from(secrets))
        kind = draw(st.sampled_from(["raw", "form", "wrapped", "embedded", "noise"]))
        if kind == "raw":
            parts.append(secret)
        elif kind == "form":
            parts.append(draw(st.sampled_from(sorted(forms_of(secret)))))
        elif kind in ("wrapped", "embedded"):
            payload = secret.encode()
            if kind == "embedded":
                payload = draw(st.binary(max_size=5)) + payload + draw(st.binary(max_size=5))
            encoded = base64.b64encode(payload).decode()
            parts.append(_wrapped(encoded, draw(st.integers(1, 90)), draw(st.sampled_from(["\n", "\r\n", "\n  "]))))
        parts.append(draw(NOISE))
    return "".join(parts)


def _unbroken(text: str) -> str:
    return re.sub(r"(?:\r?\n|\\r?\\n)[ \t]*", "", text)


def _surviving(secrets: list[str], text: str) -> list[str]:
    """The forms of ``secrets`` (of 8 characters or more) still in ``text``, as it is or read across its breaks."""
    views = (text, _unbroken(text))
    return [form for secret in secrets for form in forms_of(secret)
            if len(form) >= 8 and any(form in view for view in views)]


def _total_forms(secrets: list[str]) -> int:
    return sum(len(form) for secret in secrets for form in forms_of(secret))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), secrets=st.lists(SECRETS, min_size=1, max_size=4, unique=True))
def test_no_form_of_a_secret_survives_and_the_work_is_linear(data, secrets):
    text = data.draw(outputs(secrets))
    redactor = Redactor({f"S{i}": secret for i, secret in enumerate(secrets)})
    redacted = redactor.text(text)
    assert _surviving(secrets, redacted) == []
    assert redactor.work <= WORK_PER_CHARACTER * (len(text) + _total_forms(secrets))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), secrets=st.lists(SECRETS, min_size=1, max_size=3, unique=True),
       cut=st.integers(0, 400), binary=st.binary(max_size=40))
def test_any_chunking_of_a_file_redacts_as_the_whole_file_does(data, secrets, cut, binary):
    whole = data.draw(outputs(secrets)).encode() + binary
    sizes = data.draw(st.lists(st.integers(1, 97), max_size=30))
    chunks, position = [], 0
    for size in sizes:
        chunks.append(whole[position:position + size])
        position += size
    chunks.append(whole[position:])
    redactor = Redactor({f"S{i}": secret for i, secret in enumerate(secrets)})
    assert b"".join(redactor.redacted_chunks(iter(chunks))) == redactor.data(whole)


@settings(max_examples=150, deadline=None)
@given(secrets=st.lists(SECRETS, min_size=1, max_size=3, unique=True), cut=st.integers(1, 300))
def test_output_cut_anywhere_inside_a_secret_keeps_no_start_of_it(secrets, cut):
    secret = secrets[0]
    text = "output before " + secret * 2
    kept = text[: len("output before ") + len(secret) + min(cut, len(secret) - 1)]
    redactor = Redactor({f"S{i}": value for i, value in enumerate(secrets)})
    redacted = redactor.text(kept, cut=True)
    tail = redacted.rpartition("]")[2]
    assert not (len(tail) >= 4 and secret.startswith(tail)), (kept, redacted)
    assert redactor.work <= WORK_PER_CHARACTER * (len(kept) + _total_forms(secrets))


@settings(max_examples=150, deadline=None)
@given(secrets=st.lists(SECRETS, min_size=1, max_size=3, unique=True), text=NOISE)
def test_text_holding_no_form_is_given_back_unchanged(secrets, text):
    if _surviving(secrets, text):
        return  # the noise happens to hold a form: the property is about text that holds none
    assert Redactor({f"S{i}": secret for i, secret in enumerate(secrets)}).text(text, cut=False) == text
