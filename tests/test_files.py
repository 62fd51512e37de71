"""The atomic writer every output file goes through (files.py) and its strict JSON: a number that is not
finite is written null."""

from __future__ import annotations

import math

import pytest
from conftest import strict_json

from gru_experiments.files import atomic_write, leftover_temporaries, read_json, write_json


def test_json_is_strict_a_number_that_is_not_finite_is_null(tmp_path):
    path = write_json(tmp_path / "x.json", {"se": math.nan, "curve": [1.5, math.inf, (-math.inf, 2)],
                                            "nested": {"rate": math.nan}, "n": 3, "text": "NaN"})
    assert strict_json(path.read_text()) == {"se": None, "curve": [1.5, None, [None, 2]], "nested": {"rate": None},
                                             "n": 3, "text": "NaN"}


def test_atomic_write_replaces_whole_files_and_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "deep" / "summary.json"
    write_json(target, {"a": 1})
    assert read_json(target) == {"a": 1} and target.read_text().endswith("\n")
    atomic_write(target, b"\x00binary")
    assert target.read_bytes() == b"\x00binary"

    class Boom(Exception):
        pass

    from gru_experiments.files import atomic_file

    with pytest.raises(Boom), atomic_file(target) as f:
        f.write(b"half a file")
        raise Boom
    assert target.read_bytes() == b"\x00binary"  # the old content, whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["summary.json"]
    assert leftover_temporaries(target.parent) == []
    assert read_json(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{")
    assert read_json(tmp_path / "bad.json") is None
