"""The suite assumes nothing of a machine's speed: no property test has a per-example deadline (tests/conftest.py)."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st


def test_property_tests_have_no_wall_clock_deadline() -> None:
    assert settings.default.deadline is None


@settings(max_examples=2)
@given(st.integers())
def test_a_slow_example_is_no_failure(n: int) -> None:
    """An example as slow as a busy machine makes a quick one (hypothesis's default deadline is 200 ms)."""
    time.sleep(0.25)
