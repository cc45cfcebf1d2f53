"""Review of issue 30's redaction fixes (``worker.secrets``): what still gets through, and what still costs the
worker more than the run's own limits.

Each attack is written as the safe behaviour; those that got through when the review was made (the figures in
their docstrings or comments) fail on the code before their fixes. Cost is measured by counting (``Redactor.work``, the bound the redactor's own property
tests hold it to: ``WORK_PER_CHARACTER`` per character of text and forms) or by a fresh process's peak resident
size (``ru_maxrss``), never by timing.
"""

from __future__ import annotations

import base64
import json
import os
import random
import string
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from worker import defaults
from worker.artifacts import FileArtifactStore
from worker.contract import RunLimits, RunResult
from worker.errors import SecretError
from worker.secrets import Redactor, forms_of, redact_result, redacting_sink
from worker.secrets.store import check_value

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]
WORK_PER_CHARACTER = 64
"""tests/worker/test_redaction_properties.py's bound: work per character of text and of the forms."""
SECRET = "Zq8vT3kLmW2pXr9sBn4yHc7dFg"


def _random(seed: int, size: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    generator = random.Random(seed)
    return "".join(generator.choice(alphabet) for _ in range(size))


def _forms_size(secrets: dict[str, str]) -> int:
    return sum(len(form) for value in secrets.values() for form in forms_of(value))


def _peak_growth_in_fresh_process(script: str) -> int:
    """Bytes the peak resident size of a fresh interpreter grew by while ``script`` ran its measured part (it
    prints the KiB it grew by as its last line)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    return int(done.stdout.split()[-1]) * 1024


_MEASURE = """
    import gc, resource
    def measured(work):
        gc.collect()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        work()
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


# ---- leaks ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["json of base64 at 20", "json of the value at 13", "repr of the value at 13"])
def test_a_secret_wrapped_with_escaped_line_breaks_is_found(spelling):
    encoded = base64.b64encode(SECRET.encode()).decode()
    wrapped = {"json of base64 at 20": json.dumps({"pem": "\n".join(textwrap.wrap(encoded, 20))}),
               "json of the value at 13": json.dumps({"v": "\n".join(textwrap.wrap(SECRET, 13))}),
               "repr of the value at 13": repr("\n".join(textwrap.wrap(SECRET, 13)))}[spelling]
    redacted = Redactor({"K": SECRET}).text(wrapped)
    assert "[redacted:K]" in redacted, redacted


def test_a_secret_after_an_escaped_backslash_in_json_is_found():
    secret = "nvapi-" + _random(1, 30)
    printed = json.dumps({"path": "C:\\" + secret})  # {"path": "C:\\nvapi-..."}
    redacted = Redactor({"K": secret}).text(printed)
    assert secret not in redacted, redacted


@pytest.mark.parametrize("printed", [r"C:\keys\{}", "dir\\{}", "{}nothing"])
def test_a_secret_after_or_before_a_single_backslash_is_found(printed):
    """Contained today only because the escaped-break pattern never matches a lone '\\n': fixing that pattern must
    keep these (read the text as it is too)."""
    secret = ("nvapi-" if printed.startswith("C:") else "rk_live_") + _random(2, 30)
    if printed.startswith("{}"):
        secret += "\\"  # a value ending in a backslash, printed before an 'n'
    redacted = Redactor({"K": secret}).text(printed.format(secret))
    assert secret not in redacted, redacted


def test_two_secrets_that_overlap_in_the_output_are_both_taken_out():
    secrets = {"A": "xyz1234567", "B": "4567-the-real-long-secret-value"}
    redacted = Redactor(secrets).text("token xyz1234567-the-real-long-secret-value end")
    assert "the-real-long-secret" not in redacted, redacted


def test_a_streamed_file_is_redacted_as_the_whole_file_is_with_blank_lines_inside_a_form():
    redactor = Redactor({"K": SECRET})
    spread = ("\n" * 120).join(SECRET)  # 26 characters over ~3,000: more than hold (~1,900)
    data = (b"x" * 5000 + spread.encode() + b"y" * 5000) * 3
    whole = redactor.data(data)
    assert SECRET.encode() not in whole.replace(b"\n", b"")  # redacting it whole finds it
    chunks = [data[at:at + 1024] for at in range(0, len(data), 1024)]
    assert b"".join(redactor.redacted_chunks(iter(chunks))) == whole


def test_a_secret_split_across_two_chunks_at_every_offset_is_taken_out():
    redactor = Redactor({"K": SECRET})
    encoded = base64.b64encode(SECRET.encode())
    for form in (SECRET.encode(), encoded, b"\n".join([encoded[:9], encoded[9:20], encoded[20:]])):
        for offset in range(len(form) + 1):
            data = b"a" * 3000 + form + b"b" * 3000
            cut = 3000 + offset
            for size in (cut, 1024):
                chunks = [data[:cut], data[cut:]] if size == cut else [data[i:i + size] for i in range(0, len(data), size)]
                out = b"".join(redactor.redacted_chunks(iter(chunks)))
                assert out == redactor.data(data) and b"[redacted:K]" in out, (form, offset, size)


def test_a_secret_straddling_the_stdout_cap_and_its_marker_leaves_no_start_of_it():
    limits = RunLimits(stdout_bytes=4096)
    encoded = base64.b64encode(SECRET.encode()).decode()
    for head in ("x" * 100 + SECRET[:12], "x" * 100 + "\n".join(textwrap.wrap(encoded, 7))[:25]):
        marker = defaults.TRUNCATION_MARKER.format(omitted=123)
        result = RunResult(run_id="r", workspace_id="w", runtime="local", exit_code=0, stdout=head + marker,
                           stdout_truncated=True)
        redact_result(result, Redactor({"K": SECRET}), limits)
        kept = result.stdout.split("\n[skillrun")[0]
        assert kept.endswith("[redacted:K]"), kept
        assert result.stdout.endswith(marker)


def test_a_secret_in_an_artifacts_name_and_content_is_taken_out_of_both(tmp_path):
    store = FileArtifactStore(tmp_path / "store")
    sink = redacting_sink(store, "ws", Redactor({"K": SECRET}))
    path = tmp_path / "f.txt"
    path.write_bytes(b"head " + SECRET.encode() + b" tail")
    fd = os.open(path, os.O_RDONLY)
    try:
        stored = sink(f"out/{SECRET}.txt", fd, "text/plain", MiB)
    finally:
        os.close(fd)
    assert SECRET not in stored.name
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert SECRET.encode() not in on_disk and SECRET not in "".join(map(str, (tmp_path / "store").rglob("*")))


# ---- cost: work -----------------------------------------------------------------------------------------------------

def _sharing_an_anchor(count: int = 100) -> dict[str, str]:
    """``count`` values (a team's most) that begin alike: 40 'a's, then their own 23 characters."""
    return {f"P{i}": "a" * 40 + f"{i:02d}" + _random(i, 21) for i in range(count)}


def test_many_secrets_sharing_a_start_cost_work_linear_in_the_output():
    secrets = _sharing_an_anchor()
    redactor = Redactor(secrets)
    text = "a" * MiB
    redactor.text(text)
    assert redactor.work <= WORK_PER_CHARACTER * (len(text) + _forms_size(secrets)), redactor.work


JWT_HEADER = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
"""The base64url of {"alg":"HS256","typ":"JWT"} and its dot: what almost every JWT begins with."""


def test_a_log_of_other_jwts_costs_work_linear_in_it_for_a_team_of_jwt_secrets():
    generator = random.Random(7)
    secrets = {f"J{i}": JWT_HEADER + base64.urlsafe_b64encode(generator.randbytes(7000)).decode().rstrip("=")
               for i in range(100)}
    redactor = Redactor(secrets)
    text = (JWT_HEADER + "eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc\n") * (MiB // 70)
    redactor.text(text)
    assert redactor.work <= WORK_PER_CHARACTER * (len(text) + _forms_size(secrets)), redactor.work


def test_secrets_that_repeat_themselves_cost_work_near_the_bound():
    """800 repeating forms (100 values of a 17-character piece repeated to 10 KiB) each take a pass of str.find
    over the text: measured 64.6 per character (0.1 s a MiB; 1.3 s for a cut stdout's prefix-function pass over
    every form). Contained within twice the bound."""
    secrets = {f"R{i}": (_random(100 + i, 17) * 620)[:10400] for i in range(100)}
    redactor = Redactor(secrets)
    text = _random(5, MiB)
    redactor.text(text)
    assert redactor.work <= 2 * WORK_PER_CHARACTER * (len(text) + _forms_size(secrets)), redactor.work


def test_near_misses_of_one_big_secret_cost_work_linear_in_the_output():
    secret = _random(9, 60000)
    redactor = Redactor({"BIG": secret})
    text = "".join(secret[:1000 + i] + "#" for i in range(0, 900, 3))[:MiB]
    redactor.text(text, cut=True)
    assert redactor.work <= WORK_PER_CHARACTER * (len(text) + _forms_size({"BIG": secret}))


# ---- cost: memory ---------------------------------------------------------------------------------------------------

_DENSE = _MEASURE + """
    from worker.secrets import Redactor
    secret = "Zq8vT3kLmW2pXr9sBn4yHc7dFg"
    redactor = Redactor({{"K": secret}})
    redactor.text("warm " + secret)
    size = 8 * 1024 * 1024
    text = {shape!r}
    text = {{"newlines": "\\n" * size + secret, "indented": "\\n " * (size // 2) + secret,
             "escaped crlf": "\\\\r\\\\n" * (size // 4), "none": "x" * size + secret}}[text]
    measured(lambda: redactor.text(text))
"""


@pytest.mark.parametrize("shape", ["newlines", "indented", "escaped crlf"])
def test_a_text_dense_with_line_breaks_costs_memory_linear_in_it(shape):
    grown = _peak_growth_in_fresh_process(_DENSE.format(shape=shape))
    assert grown < 8 * 8 * MiB, grown


def test_a_text_without_line_breaks_costs_memory_linear_in_it():
    grown = _peak_growth_in_fresh_process(_DENSE.format(shape="none"))
    assert grown < 8 * 8 * MiB, grown  # measured +24 MiB


_STREAMED = _MEASURE + """
    import random
    from worker.secrets import Redactor
    generator = random.Random(3)
    control = [chr(c) for c in range(1, 32) if chr(c) not in "\\n\\r\\t"]
    big = "".join(generator.choice(control) for _ in range(64 * 1024))  # a 64 KiB value: JSON escapes it 6 to 1
    secret = "Zq8vT3kLmW2pXr9sBn4yHc7dFg"
    redactor = Redactor({{"K": secret, "BIG": big}} if {big} else {{"K": secret}})
    chunk = b"\\n" * (1024 * 1024 - len(secret)) + secret.encode()
    def stream():
        for _ in redactor.redacted_chunks(chunk for _ in range(64)):
            pass
    measured(stream)
"""


def test_streaming_an_artifact_costs_memory_bounded_whatever_the_teams_secrets():
    grown = _peak_growth_in_fresh_process(_STREAMED.format(big=True))
    assert grown < 256 * MiB, grown


def test_streaming_an_artifact_with_a_short_secret_costs_memory_bounded():
    grown = _peak_growth_in_fresh_process(_STREAMED.format(big=False))
    assert grown < 256 * MiB, grown  # measured +59 MiB (1 MiB chunks read through _Unbroken)


@pytest.mark.parametrize("value", ["a" * 100, "ab" * 40, "a" * 40 + "Zq8vT3kLmW2pXr9sBn4y", "0123456789" * 8])
def test_a_value_starting_with_a_short_piece_repeated_is_refused_when_set(value):
    """The one shape whose anchor places overlap and each read on for long (100 such values cost 827 work a
    character of a text of their piece): refused when set, with nothing stored; a chain of certificates, whose
    header comes again far on, is a value like any other."""
    with pytest.raises(SecretError, match="starts with a short piece repeated"):
        check_value("K", value)
    header = "-----BEGIN CERTIFICATE-----\nMIIF"
    check_value("CHAIN", header + _random(3, 1200) + "\n-----END CERTIFICATE-----\n" + header + _random(4, 1200))
