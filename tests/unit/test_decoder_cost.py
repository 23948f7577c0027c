"""Every decoder takes time linear in the body, on the worst documents we can write.

A document with 200,000 attributes on one element once took 90 seconds to decode
(lxml reads an attribute's value by walking the element's attribute list, so reading
them all was quadratic), and decoding runs on the event loop. This guard decodes
each of tests/worst.py's documents at doubling sizes up to ``max_body`` with each
decoder that reads it, and asks that each answer or refusal take at most BOUND
seconds and that doubling the body at most about double the CPU time (at most
RATIO times on average over two doublings, where linear is 2 and quadratic 4).
Timings are minima of repeated runs (load only adds time), and a ratio is only
judged above FLOOR seconds, where it is not noise.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.server.config import Config
from restms import Format, RestMSError, decode, fastpath
from restms.xmlscan import scan
from tests.worst import WORST

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Config()
CODEC, LIMITS, MAX_BODY = CONFIG.codec, CONFIG.limits, CONFIG.max_body
SIZES = [MAX_BODY >> shift for shift in (3, 2, 1, 0)]  # 512 KiB to 4 MiB
BOUND = 2.0  # seconds of wall time for one decode, on a loaded machine
RATIO = 3.0  # CPU time at 2N over N, at most (on average over two doublings)
FLOOR = 0.02  # seconds of CPU time under which a ratio is not judged

Decoder = Callable[[bytes], object]

DECODERS: dict[str, dict[str, Decoder]] = {
    "xml": {
        "generic": lambda body: decode(body, Format.XML, CODEC),
        "scanner": lambda body: scan(body, LIMITS.max_messages),
        "publish": lambda body: fastpath.messages(body, Format.XML, CODEC, LIMITS),
    },
    "json": {
        "generic": lambda body: decode(body, Format.JSON, CODEC),
        "publish": lambda body: fastpath.messages(body, Format.JSON, CODEC, LIMITS),
    },
}

# Documents every decoder but the scanner (which then gives up, returning None) refuses.
REFUSED = {
    "xml-attributes-on-message",
    "xml-attributes-on-feed",
    "xml-attributes-on-header",
    "xml-deep",
    "xml-long-attribute-name",
    "xml-long-element-name",
    "xml-entity-declarations",
    "xml-entity-expansion",
    "xml-undeclared-entities",
    "json-keys-on-message",
    "json-keys-on-feed",
    "json-keys-on-header",
    "json-keys-on-root",
    "json-deep",
    "json-long-key",
}


def run(decoder: Decoder, body: bytes) -> tuple[float, float, object]:
    """CPU and wall seconds of one decode, and its result or its refusal.

    The garbage collector is off meanwhile: what is timed is the decoder's own work. A
    collection, which the larger body's allocations may happen to set off, costs in
    proportion to every object the test process holds (thousands of tests' worth in a
    whole run): in CI one made a 4 MiB decode 14 times a 1 MiB one."""
    gc.disable()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            outcome = decoder(body)
        except RestMSError as exc:
            outcome = exc
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        gc.enable()
    if isinstance(outcome, RestMSError):
        assert outcome.status < 500, outcome  # a refusal, never a failure
    return cpu, wall, outcome


def fastest(decoder: Decoder, body: bytes, runs: int) -> tuple[float, float, object]:
    results = [run(decoder, body) for _ in range(runs)]
    return min(r[0] for r in results), min(r[1] for r in results), results[0][2]


def apart(name: str, label: str, small: int, large: int) -> tuple[float, float]:
    """The fastest of 5 decodes of ``name`` at each size, in a fresh interpreter."""
    code = (
        "import sys, json\n"
        "from tests.unit.test_decoder_cost import DECODERS, WORST, fastest\n"
        "build, fmt = WORST[sys.argv[1]]\n"
        "decoder = DECODERS[fmt][sys.argv[2]]\n"
        "print(json.dumps([fastest(decoder, build(int(n)), 5)[0] for n in sys.argv[3:]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, name, label, str(small), str(large)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    before, after = json.loads(done.stdout)
    return float(before), float(after)


@pytest.mark.parametrize("name", WORST)
def test_each_decoder_takes_linear_time_on_the_worst_documents(name: str) -> None:
    build, fmt = WORST[name]
    bodies = [build(size) for size in SIZES]
    assert all(len(body) <= MAX_BODY for body in bodies)
    assert len(bodies[-1]) > MAX_BODY * 0.9  # the builder fills the limit
    for label, decoder in DECODERS[fmt].items():
        where = f"{name} by the {fmt} {label} decoder"
        cpus = []
        for size, body in zip(SIZES, bodies, strict=True):
            cpu, wall, outcome = run(decoder, body)
            if wall > BOUND:  # once more, in case the machine was busy
                cpu, wall, outcome = fastest(decoder, body, 2)
            assert wall <= BOUND, f"{where}: {wall:.2f} s at {size} bytes"
            if name in REFUSED and label != "scanner":
                assert isinstance(outcome, RestMSError), f"{where}: accepted"
            cpus.append(cpu)
        # Judged over two doublings (linear is 4, quadratic 16): one doubling may cross
        # a cache size and cost 3 times as much, the next then less than twice.
        for small, large in zip(range(len(SIZES) - 2), range(2, len(SIZES)), strict=True):
            if cpus[large] > FLOOR and cpus[large] > RATIO**2 * cpus[small]:
                # Measured again, both, before judging: a busy moment is not a trend;
                # and in a process of its own, whose heap holds nothing but the two
                # decodes (late in a whole run this one's heap made a linear decoder's
                # 4 MiB cost 17 times its 1 MiB, garbage collector off).
                before, after = apart(name, label, SIZES[small], SIZES[large])
                assert after <= RATIO**2 * before, (
                    f"{where}: {before:.3f} s at {SIZES[small]} bytes, "
                    f"{after:.3f} s at {SIZES[large]}"
                )
