"""The plain-shape recogniser either gives up or says exactly what lxml says.

Differential tests: documents are written as raw text from a grammar that mixes the
plain shape with everything the recogniser must not accept (entities, references,
controls, CR, tabs in attributes, ``]]>``, comments, DOCTYPEs, prefixes, duplicates,
odd declarations). Whenever :func:`restms.xmlscan.scan` answers, the hardened lxml
parser must accept the same bytes and find the same messages, attributes and texts.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from restms import RestMSError, xmlscan
from restms.xmlcodec import local_tag, parse_root
from restms.xmlscan import MAX_BODY, Scanned, scan
from tests.examples import examples


def _lxml_view(body: bytes) -> list[tuple[dict[str, str], list[dict[str, str]], list[tuple]]]:
    """What lxml finds, in the recogniser's terms (raises on what lxml refuses)."""
    root = parse_root(body)
    out = []
    assert root.text is None or not root.text.strip()
    for node in root:
        assert local_tag(node.tag) == "message"
        assert node.text is None or not node.text.strip()
        headers, contents = [], []
        for child in node:
            attrs = dict(child.attrib)
            if local_tag(child.tag) == "header":
                headers.append(attrs)
            else:
                assert local_tag(child.tag) == "content"
                contents.append((attrs, child.text))
            assert child.tail is None or not child.tail.strip()
        out.append((dict(node.attrib), headers, contents))
    return out


def _view(found: list[Scanned]) -> list[tuple[dict[str, str], list[dict[str, str]], list[tuple]]]:
    """The recogniser's answer with each tag as its attributes (tags are shared objects)."""
    return [
        (head.attrs, [tag.attrs for tag in headers], [(tag.attrs, text) for tag, text in contents])
        for head, headers, contents in found
    ]


def _agrees(body: bytes) -> bool:
    """True when the recogniser answered (and then it must equal lxml)."""
    found = scan(body)
    if found is None:
        return False
    assert _view(found) == _lxml_view(body), body
    return True


# ---------------------------------------------------------------- the grammar
tricky = st.sampled_from(
    [
        "a",
        " ",
        "\n",
        "\t",
        "\r",
        "\r\n",
        "&amp;",
        "&lt;",
        "&gt;",
        "&quot;",
        "&apos;",
        "&",
        "&#65;",
        "&#x41;",
        "&nbsp;",
        "&amp",
        "<",
        ">",
        "]]>",
        "]]",
        "'",
        '"',
        "\x01",
        "\x0b",
        "\x7f",
        "\x85",
        "\ufffe",
        "\uffff",
        "\ufeff",
        "é",
        "\U0001d11e",
        "<!--c-->",
        "<![CDATA[x]]>",
        "<?pi x?>",
    ]
)
plain = st.text(
    st.characters(codec="utf-8", exclude_characters="<&]\ufffe\uffff", min_codepoint=32),
    max_size=8,
)
# Mostly plain text, with one hostile piece in about a third of the texts.
texts = st.one_of(plain, plain, st.lists(st.one_of(plain, tricky), max_size=4).map("".join))
spaces = st.sampled_from(["", " ", "\n  ", "\t"])  # CR: in the hostile pieces
safe_names = st.sampled_from(["address", "type", "name", "value", "encoding", "x-y", "a.b"])
names = st.one_of(
    st.sampled_from(["address", "type", "name", "value", "encoding", "x-y", "a.b", "_u"]),
    st.sampled_from(["xmlns", "p:q", "type"]),
)


@st.composite
def attributes(draw: st.DrawFn, hostile: bool) -> str:
    out = []
    for name in draw(st.lists(names if hostile else safe_names, max_size=3, unique=not hostile)):
        quote = draw(st.sampled_from(['"', "'"]))
        value = draw(texts if hostile else plain).replace(quote, "")
        out.append(
            f"{draw(st.sampled_from([' ', '  ', chr(10)]))}{name}{draw(spaces)}="
            f"{draw(spaces)}{quote}{value}{quote}"
        )
    return "".join(out) + draw(spaces)


@st.composite
def children(draw: st.DrawFn, hostile: bool) -> str:
    tag = draw(st.sampled_from(["content", "header", "feed"] if hostile else ["content", "header"]))
    attrs = draw(attributes(hostile))
    if draw(st.booleans()):
        return f"{draw(spaces)}<{tag}{attrs}/>"
    text = draw(texts if hostile else plain)
    return f"{draw(spaces)}<{tag}{attrs}>{text}</{tag}{draw(spaces)}>"


@st.composite
def messages(draw: st.DrawFn, hostile: bool) -> str:
    attrs = draw(attributes(hostile))
    if draw(st.booleans()):
        return f"{draw(spaces)}<message{attrs}/>"
    inner = "".join(draw(st.lists(children(hostile), max_size=3)))
    between = draw(st.sampled_from(["", " ", "x"] if hostile else ["", " \n"]))
    return f"{draw(spaces)}<message{attrs}>{between}{inner}{draw(spaces)}</message>"


declarations_plain = [
    "",
    "<?xml version='1.0' encoding='UTF-8'?>\n",
    '<?xml version="1.0"?>',
    '<?xml version="1.0" encoding="utf-8" standalone="yes"?>',
]
declarations = st.sampled_from(
    [
        "<?xml version='1.0' encoding='UTF-8'?>\n",
        '<?xml version="1.0"?>',
        '<?xml version="1.0" encoding="utf-8" standalone="yes"?>',
        '<?xml version="1.0" encoding="ISO-8859-1"?>',
        '<?xml version="1.1"?>',
        " <?xml version='1.0'?>",
        "<!DOCTYPE restms>",
        '<!DOCTYPE r [<!ENTITY e "x">]>',
        "<!-- c -->",
        "\ufeff",
    ]
)
roots_plain = [
    "<restms>",
    '<restms xmlns="http://www.restms.org/schema/restms">',
    "<restms xmlns = 'http://www.restms.org/schema/restms' >",
]
roots = st.sampled_from(
    [
        '<restms xmlns="http://www.restms.org/schema/restms">',
        "<restms xmlns='urn:x'>",
        '<restms xmlns=" http://www.restms.org/schema/restms">',
        "<restms xmlns='http://www.restms.org/schema/restms\">",
        '<restms xmlns="a&amp;b">',
        '<restms xmlns:p="urn:p">',
        "<restms a='1'>",
        "<r:restms xmlns:r='urn:r'>",
    ]
)


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    """A third hostile throughout, a third plain, a third plain with one hostile splice."""
    kind = draw(st.sampled_from(["hostile", "plain", "spliced"]))
    hostile = kind == "hostile"
    root = draw(roots) if hostile else draw(st.sampled_from(roots_plain))
    end = "</r:restms>" if root.startswith("<r:") else "</restms>"
    body = "".join(draw(st.lists(messages(hostile), min_size=1, max_size=4)))
    tail = draw(st.sampled_from(["", "\n", "<!-- after -->", "x"] if hostile else ["", "\n"]))
    head = draw(declarations) if hostile else draw(st.sampled_from(declarations_plain))
    text = f"{head}{root}{body}{draw(spaces)}{end}{tail}"
    if kind == "spliced":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(tricky) + text[at:]
    return text.encode(draw(st.sampled_from(["utf-8"] * 5 + ["latin-1"])), "replace")


# ---------------------------------------------------------------- the tests
@settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_recogniser_answers_only_what_lxml_says(body: bytes) -> None:
    try:
        _agrees(body)
    except RestMSError:  # raised by lxml's side: then the recogniser must not answer
        assert scan(body) is None, body
    except etree.LxmlError:  # pragma: no cover - parse_root turns these into RestMSError
        raise


@pytest.mark.parametrize(
    "body",
    [
        b"<restms><message/></restms>",
        b'<restms xmlns="http://www.restms.org/schema/restms"><message address="a"/></restms>',
        b"<?xml version='1.0' encoding='UTF-8'?>\n<restms>\n  <message address='a'>\n"
        b'    <header name="h" value="v"/>\n'
        b'    <content type="text/plain">caf\xc3\xa9 &amp; &lt;tea&gt; \xf0\x9d\x84\x9e</content>'
        b"\n  </message>\n</restms>\n",
        b'<restms><message reply_to="a&amp;b"><content></content><content/></message></restms>',
    ],
)
def test_plain_shapes_are_recognised(body: bytes) -> None:
    assert _agrees(body)


@pytest.mark.parametrize(
    "body",
    [
        b'<!DOCTYPE r [<!ENTITY e "x">]><restms><message/></restms>',
        b"<restms><!-- c --><message/></restms>",
        b"<restms><message><content><![CDATA[x]]></content></message></restms>",
        b"<restms><?pi?><message/></restms>",
        b"\xef\xbb\xbf<restms><message/></restms>",  # byte-order mark
        b"<?xml version='1.0' encoding='ISO-8859-1'?><restms><message/></restms>",
        b"<restms><message><content>\xff</content></message></restms>",  # not UTF-8
        b"<restms><message><content>&#65;</content></message></restms>",
        b"<restms><message><content>&e;</content></message></restms>",
        b"<restms><message><content>a\x01b</content></message></restms>",
        b"<restms><message><content>a\r\nb</content></message></restms>",
        b"<restms><message><content>]]></content></message></restms>",
        b"<restms><message><content>\xef\xbf\xbe</content></message></restms>",
        b'<restms><message address="a\tb"/></restms>',  # normalised by XML
        b'<restms><message address="a" address="b"/></restms>',
        b'<restms><message xmlns="urn:x"/></restms>',
        b'<restms xmlns:p="urn:p"><message p:address="a"/></restms>',
        b"<restms><message>text<content/></message></restms>",
        b'<restms><message><feed name="f"/></message></restms>',
        b"<restms><message><content><x/></content></message></restms>",
        b"<restms><message/>tail</restms>",
        b"<restms><message/></restms><!-- after -->",
        b"<restms><message></content></message></restms>",
    ],
)
def test_everything_else_is_left_to_lxml(body: bytes) -> None:
    assert scan(body) is None


@pytest.mark.parametrize(
    "inner",
    [
        b"",  # nothing between the tags
        b'<header name="a" value="1"/> <header name="b"/>\n<content>x</content>',
        b"<content>one</content><content>two</content>",  # two contents: tag by tag
        b"<content/>",  # an empty content: tag by tag
        b'<header name="a"></header><content>x</content>',  # a header written in full
        b'<content type="t" encoding="plain">a &amp; b</content>\n',
    ],
)
def test_messages_read_whole_or_tag_by_tag_agree_with_lxml(inner: bytes) -> None:
    body = b"<restms><message address='a'>" + inner + b"</message><message/></restms>"
    assert _agrees(body)


ROOT = b'<restms xmlns="http://www.restms.org/schema/restms">'


@pytest.mark.parametrize(
    "rest",
    [
        b'<message address="a"><content type="t">x &amp; y</content></message></restms>',
        b"<message/></restms>",
        b"<message></message></restms>\n",
        b'<message><header name="h"/><content>x</content></message></restms >',
        b"<message><content>x</content></message> <message/></restms>",
        b"<message><content>one</content><content>two</content></message></restms>",
        b"<message><content/></message><message><content>x</content></message></restms>",
    ],
)
def test_the_common_opening_and_end_agree_with_lxml(rest: bytes) -> None:
    """The root's usual start tag and a first message are read in one match."""
    assert _agrees(ROOT + rest)


@pytest.mark.parametrize(
    "rest",
    [
        b"<message><content>x</content></message></restms>x",
        b"<message><content>x</content></message></restms></restms>",
        b"<message><content>x</content></message>",
        b"<message><content>x</content></message><feed/></restms>",
        b"<message/><content>x</content></message></restms>",
    ],
)
def test_near_misses_of_the_common_document_are_left_to_lxml(rest: bytes) -> None:
    assert scan(ROOT + rest) is None


@pytest.mark.parametrize(
    "inner",
    [
        b'<header name="a"><header name="b"/>',  # a header left open
        b"<content>x</content><header name='a'/>x",  # text after the content
        b"<content>x</contents>",
        b"<content>x</content></content>",
        b'<header name="a" name="b"/><content>x</content>',
    ],
)
def test_near_misses_of_the_common_message_are_left_to_lxml(inner: bytes) -> None:
    assert scan(b"<restms><message>" + inner + b"</message></restms>") is None


@pytest.mark.parametrize("bad", ["\x01", "\x1f", "\r", "\ufffe", "]]>", "&#65;"])
def test_large_bodies_are_checked_as_small_ones(bad: str) -> None:
    """Past a few KiB the control characters are looked for another way: same answer."""
    text = "x" * 6000
    plain = f"<restms><message><content>{text}</content></message></restms>".encode()
    assert _agrees(plain)
    spoilt = f"<restms><message><content>{text}{bad}</content></message></restms>".encode()
    assert scan(spoilt) is None


@pytest.mark.parametrize("size", [10, 6000])  # both ways of looking for controls
@pytest.mark.parametrize("code", range(0x20))
def test_every_control_character_is_left_to_lxml(code: int, size: int) -> None:
    text = "x" * size + chr(code)
    body = f"<restms><message><content>{text}</content></message></restms>".encode()
    if chr(code) in "\t\n":
        assert _agrees(body)
    else:
        assert scan(body) is None


def test_bodies_over_lxml_text_limit_are_left_to_lxml() -> None:
    text = b"a" * (MAX_BODY + 1)
    assert scan(b"<restms><message><content>" + text + b"</content></message></restms>") is None


def test_repeated_attribute_lists_are_shared_not_rebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    # An empty cache: after thousands of generated documents it may be full (it keeps
    # 1,024 tags), and then nothing is shared.
    monkeypatch.setattr(xmlscan, "_SEEN", {})
    body = b'<restms><message address="k"/><message address="k"/></restms>'
    first, second = scan(body) or []
    assert first[0].attrs == {"address": "k"}
    assert first[0] is second[0]


def test_start_tags_remembered_for_the_common_message_are_only_open_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An empty <message/> or <content/> where the common message has its start tags is
    # never remembered as one: read again (from the caches), it is still left to lxml.
    for name in ("_SEEN", "_MESSAGE_STARTS", "_CONTENT_STARTS"):
        monkeypatch.setattr(xmlscan, name, {})
    empty_head = ROOT + b"<message/><content>x</content></message></restms>"
    empty_content = ROOT + b"<message><content/>x</content></message></restms>"
    good = ROOT + b'<message address="a"><content type="t">x &lt; y</content></message></restms>'
    for _ in range(2):
        assert scan(empty_head) is None
        assert scan(empty_content) is None
        assert _agrees(good)
    assert set(xmlscan._MESSAGE_STARTS) == {"<message>", '<message address="a">'}
    assert set(xmlscan._CONTENT_STARTS) == {'<content type="t">'}
    assert "<message/>" in xmlscan._SEEN
    assert "<content/>" in xmlscan._SEEN
