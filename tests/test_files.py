"""The atomic writer every output file goes through (files.py) and its strict JSON: a number that is not
finite is written null."""

from __future__ import annotations

import math

from conftest import strict_json

from gru_experiments.files import write_json


def test_json_is_strict_a_number_that_is_not_finite_is_null(tmp_path):
    path = write_json(tmp_path / "x.json", {"se": math.nan, "curve": [1.5, math.inf, (-math.inf, 2)],
                                            "nested": {"rate": math.nan}, "n": 3, "text": "NaN"})
    assert strict_json(path.read_text()) == {"se": None, "curve": [1.5, None, [None, 2]], "nested": {"rate": None},
                                             "n": 3, "text": "NaN"}
