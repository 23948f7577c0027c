"""The publish path's plain-text check, read from the bytes, against the rule itself
(``codec.plain``, XML 1.0's characters, on the decoded text)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from restms_client import codec
from tests.examples import examples


def by_the_rule(body: bytes) -> str | None:
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    return text if codec.plain(text) else None


@settings(max_examples=examples(2000))
@example(body=b"")
@example(body=b"tab\there, lines\r\n")
@example(body=b"a \x00 NUL")
@example(body=b"\x1f")
@example(body=b"\x7f and \xc2\x85 (C1 controls XML 1.0 allows)")
@example(body="\ufffd".encode())
@example(body="\ufffe".encode())
@example(body="\uffff".encode())
@example(body="\U0010ffff".encode())
@example(body=b"\xed\xa0\x80")  # a surrogate, encoded
@example(body=b"\xef\xbf")  # cut short
@given(
    body=st.binary()
    | st.text(st.characters(codec=None, categories=None)).map(
        lambda t: t.encode("utf-8", "surrogatepass")
    )
    | st.text(st.sampled_from("\x00\x08\t\n\x0b\r\x1f ab\x7f\ufffd\ufffe\uffff")).map(str.encode)
)
def test_the_plain_text_check_answers_as_the_rule(body: bytes) -> None:
    assert codec._plain_text(body) == by_the_rule(body)
