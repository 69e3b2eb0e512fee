"""The size of the hand-picked bad-input corpus, per seam (the README states the total).

``pytest tests/offline/test_bad_input_count.py -s`` prints the table.  Hypothesis adds
generated inputs on top (the property tests in ``test_bad_input_*.py``).
"""

from __future__ import annotations

from tests.corpus.cases import SEAMS, Case


def distinct(cases: list[Case]) -> int:
    """How many different inputs a seam's cases hold (ids and values both unique)."""
    return len({repr(c.value) for c in cases})


def test_every_case_is_distinct_and_named_once() -> None:
    for seam, cases in SEAMS.items():
        ids = [c.id for c in cases]
        assert len(set(ids)) == len(ids), seam
        assert distinct(cases) == len(cases), seam


def test_the_corpus_holds_at_least_200_distinct_inputs() -> None:
    counts = {seam: distinct(cases) for seam, cases in SEAMS.items()}
    bugs = {seam: sum(1 for c in cases if c.bug) for seam, cases in SEAMS.items()}
    width = max(map(len, counts))
    print()
    for seam, n in counts.items():
        print(f"{seam:<{width}}  {n:4d} inputs  {bugs[seam]:3d} known bugs (strict xfail)")
    print(f"{'total':<{width}}  {sum(counts.values()):4d} inputs  {sum(bugs.values()):3d}")
    assert all(counts.values())
    assert sum(counts.values()) >= 200
