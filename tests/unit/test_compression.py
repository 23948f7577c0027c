"""The packers and the coding choice of ``gateway/server/compression.py``, pure.

Every packed body unpacks to itself, also when one thread's zstd compressor is reused
for body after body (the fast path: a fresh context per reply costs more than the
packing of a small one); ``choose`` agrees with RFC 9110 12.5.3's reading of weights.
"""

from __future__ import annotations

import gzip

from hypothesis import given
from hypothesis import strategies as st

from gateway.server.compression import choose, zstandard, zstd
from gateway.server.compression import gzip as pack_gzip

CODINGS = ["gzip", "zstd", "br", "deflate", "identity", "*", "x-unknown"]


@given(st.lists(st.binary(max_size=5000), min_size=1, max_size=5))
def test_packed_bodies_unpack_to_themselves(bodies: list[bytes]) -> None:
    for body in bodies:  # one compressor, reused from one body to the next
        assert zstd.decompress(zstandard(body)) == body
        assert gzip.decompress(pack_gzip(body)) == body


@given(
    st.lists(
        st.tuples(st.sampled_from(CODINGS), st.sampled_from([None, 0, 0.001, 0.5, 1])),
        max_size=6,
        unique_by=lambda item: item[0],
    )
)
def test_choose_takes_the_acceptable_coding_of_highest_weight(
    items: list[tuple[str, float | None]],
) -> None:
    header = ", ".join(name if q is None else f"{name};q={q}" for name, q in items)
    weights = {name: 1.0 if q is None else float(q) for name, q in items}
    wildcard = weights.get("*", 0.0)
    gzip_w, zstd_w = weights.get("gzip", wildcard), weights.get("zstd", wildcard)
    chosen = choose(header)
    if max(gzip_w, zstd_w) <= 0:
        assert chosen is None
    elif zstd_w >= gzip_w:
        assert chosen == "zstd"
    else:
        assert chosen == "gzip"
