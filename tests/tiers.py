"""The slow tier's marker, for parametrizations (tests/conftest.py describes
the tiers).

    @pytest.mark.parametrize("n", slow_except([1, 2, 3, 8], range(1, 17)))

keeps the cases 1, 2, 3 and 8 in the default tier and marks the others
``slow``; the test ids stay what they were. A value of a parametrization of
several names is a tuple, as for parametrize itself.
"""

import pytest

slow = pytest.mark.slow


def slow_except(keep, values):
    """`values`, those not in `keep` marked slow (every kept value must be one of them)."""
    values, keep = list(values), list(keep)
    missing = [k for k in keep if k not in values]
    if missing:
        raise ValueError(f"slow_except: {missing} not among the values {values}")
    return [v if v in keep else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=slow) for v in values]
