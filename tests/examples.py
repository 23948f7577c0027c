"""How many examples the Hypothesis property tests try.

Each property test names the count its author chose for a thorough run (the
differential tests against lxml and the generic paths chose hundreds to thousands).
The ordinary run (``scripts/test``, CI) tries a share of it, never fewer than
Hypothesis's own default of 100: most of the time goes into generating documents, and
the full counts cost about a minute of a two-core machine on every run. Set
``RESTMS_HYPOTHESIS_SHARE=1`` (or more) for the full counts, e.g. after changing a
codec or the fast paths.
"""

from __future__ import annotations

import os

SHARE = float(os.environ.get("RESTMS_HYPOTHESIS_SHARE", "0.4"))
LEAST = 100  # Hypothesis's default max_examples


def examples(thorough: int) -> int:
    """The number of examples to try for a test whose thorough count is ``thorough``."""
    return max(min(LEAST, thorough), round(thorough * SHARE))
