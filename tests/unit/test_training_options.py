"""The one options reader: keys from the dataclass's fields, values checked and converted by type."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from squall.training.options import OptionsError, option_keys, read_options


@dataclass(frozen=True)
class Sample:
    """One field of every type the reader understands."""

    flag: bool = True
    count: int = 3
    rate: float = 0.5
    name: str = "ring"
    mode: Literal["a", "b"] = "a"
    limit: float | None = None
    tau: float | str | None = "auto"
    betas: tuple[float, float] = (0.9, 0.95)
    names: tuple[str, ...] = ("ring",)
    sizes: list[int] = field(default_factory=list)
    args: Mapping[str, Any] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    raw: Any = None
    derived: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")


READS = [
    # (config, field, value read)
    ({}, "count", 3),
    (None, "rate", 0.5),
    ({"flag": False}, "flag", False),
    ({"count": 7}, "count", 7),
    ({"count": 1e6}, "count", 1_000_000),
    ({"rate": 2}, "rate", 2.0),
    ({"name": "torus"}, "name", "torus"),
    ({"mode": "b"}, "mode", "b"),
    ({"limit": None}, "limit", None),
    ({"limit": 3}, "limit", 3.0),
    ({"tau": "auto"}, "tau", "auto"),
    ({"tau": 2}, "tau", 2.0),
    ({"tau": None}, "tau", None),
    ({"betas": [0.8, 0.99]}, "betas", (0.8, 0.99)),
    ({"names": ["ring", "torus"]}, "names", ("ring", "torus")),
    ({"sizes": [1, 2.0]}, "sizes", [1, 2]),
    ({"args": {"k": [1]}}, "args", {"k": [1]}),
    ({"weights": {"a": 1}}, "weights", {"a": 1.0}),
    ({"raw": {"anything": True}}, "raw", {"anything": True}),
]


@pytest.mark.parametrize(("config", "key", "expected"), READS)
def test_a_value_is_read_as_its_fields_type(config: dict[str, Any] | None, key: str, expected: Any) -> None:
    value = getattr(read_options(Sample, config, where="sample"), key)
    assert value == expected
    assert type(value) is type(expected)


REFUSED = [
    # (config, words the error must hold)
    ({"cuont": 3}, ["sample", "unknown option(s) ['cuont']", "allowed: ['flag', 'count'", "'raw']"]),
    ({"derived": 1}, ["unknown option(s) ['derived']"]),
    ({"flag": 1}, ["flag=1", "true or false"]),
    ({"flag": "false"}, ["flag='false'", "true or false"]),
    ({"count": True}, ["count=True", "an integer"]),
    ({"count": 2.5}, ["count=2.5", "an integer"]),
    ({"count": "8"}, ["count='8'", "an integer"]),
    ({"rate": "fast"}, ["rate='fast'", "a number"]),
    ({"name": 3}, ["name=3", "a string"]),
    ({"mode": "c"}, ["mode='c'", "one of ['a', 'b']"]),
    ({"limit": "x"}, ["limit='x'", "null or a number"]),
    ({"tau": [1]}, ["tau=[1]", "null or a number or a string"]),
    ({"betas": [0.9]}, ["betas=[0.9]", "a list of 2: a number, a number"]),
    ({"betas": "0.9,0.95"}, ["a list of 2"]),
    ({"names": ["ring", 3]}, ["names=['ring', 3]", "a list of (a string)"]),
    ({"args": [1, 2]}, ["args=[1, 2]", "an object"]),
    ({"weights": {"a": "heavy"}}, ["an object of (a number)"]),
    ({"count": None}, ["count=None", "an integer"]),
]


@pytest.mark.parametrize(("config", "words"), REFUSED)
def test_a_bad_key_or_value_is_refused_naming_it(config: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(OptionsError) as info:
        read_options(Sample, config, where="sample")
    for word in words:
        assert word in str(info.value)


def test_the_classes_own_checks_run_after_reading() -> None:
    with pytest.raises(ValueError, match="count must be >= 1, got 0"):
        read_options(Sample, {"count": 0}, where="sample")


def test_options_must_be_an_object() -> None:
    with pytest.raises(OptionsError, match=r"sample: options must be an object with keys from \['flag'"):
        read_options(Sample, [("count", 3)], where="sample")  # type: ignore[arg-type]


def test_the_keys_are_the_fields_that_init_takes() -> None:
    assert option_keys(Sample) == ("flag", "count", "rate", "name", "mode", "limit", "tau", "betas", "names",
                                   "sizes", "args", "weights", "raw")
    with pytest.raises(TypeError, match="not a dataclass"):
        option_keys(dict)


def test_a_field_type_the_reader_cannot_read_is_a_programming_error() -> None:
    @dataclass(frozen=True)
    class Odd:
        when: complex = 0j

    with pytest.raises(TypeError, match="cannot read a field of type"):
        read_options(Odd, {}, where="odd")
