"""Hostile and careless YAML: the loader refuses it quickly, in few words, naming the file once."""

from __future__ import annotations

from pathlib import Path

import pytest

from squall.profiles import ProfileError, load_profile, parse_profile
from squall.profiles.safe_yaml import BASE_LOADER, MAX_FILE_BYTES, MAX_NODES

GOOD = "name: tiny\ndescription: two nodes on a clean link\nlinks:\n  default: {delay: 1ms}\n"
SHORT_MESSAGE = 400  # characters: a message a person reads in one go


def refusal(text: str | bytes, source: str = "hostile.yaml") -> ProfileError:
    with pytest.raises(ProfileError) as info:
        parse_profile(text, source)
    message = str(info.value)
    assert message.count(source) == 1, message
    assert len(message) < SHORT_MESSAGE, message[:1000]
    return info.value


def test_the_c_loader_is_used_where_installed() -> None:
    import yaml

    assert BASE_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def test_a_good_profile_still_loads_from_text_and_bytes() -> None:
    assert parse_profile(GOOD).name == "tiny"
    assert parse_profile(GOOD.encode()).name == "tiny"


def test_alias_bomb_is_refused_by_its_node_count() -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = "\n".join(lines) + "\nname: *a9\n"
    error = refusal(bomb)  # a hang is pytest-timeout's to catch; the count is what refuses it
    assert f"more than {MAX_NODES} YAML nodes" in str(error)


def test_alias_bomb_inside_a_string_field_prints_a_short_value() -> None:
    inner = "x: &x " + "[" + ", ".join(["'" + "y" * 50 + "'"] * 50) + "]\n"
    error = refusal(inner + "name: [*x, *x, *x, *x]\ndescription: d\n")
    assert "must be a string" in str(error) or "unknown key" in str(error)


def test_recursive_alias_is_refused() -> None:
    error = refusal("name: &a [*a]\n")
    assert "refers to a node that contains it" in str(error)


def test_deep_nesting_is_refused_before_it_is_built() -> None:
    error = refusal("name: " + "[" * 5000 + "]" * 5000 + "\n")
    # Our own depth check, or (PyYAML >= 6.0.4, whose parser has a nesting limit of its own) the
    # parser's refusal: either way a profile error before any node is built.
    assert "nested more than" in str(error) or "maximum nesting depth" in str(error)


def test_a_5mb_file_is_refused_by_its_size(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(GOOD + "# " + "x" * (5 << 20) + "\n")
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert "bytes long" in message and f"at most {MAX_FILE_BYTES} bytes" in message
    assert message.count(str(path)) == 1


def test_text_over_the_size_limit_is_refused_too() -> None:
    assert "bytes long" in str(refusal(GOOD + "#" * MAX_FILE_BYTES))


def test_a_200000_character_name_is_cut_and_printed_once() -> None:
    name = "n" * 200_000
    error = refusal(f"name: {name}\ndescription: d\n")
    message = str(error)
    assert "is 200000 characters long" in message and "(200000 chars)" in message
    assert message.count("n" * 80) == 1 and "n" * 81 not in message


def test_a_long_unknown_key_is_cut_in_the_key_path() -> None:
    message = str(refusal(GOOD + "k" * 1000 + ": 1\n"))  # YAML caps plain keys at 1024 characters
    assert "unknown key" in message and "(1000 chars)" in message


def test_duplicated_keys_name_the_key_path_and_both_lines() -> None:
    text = "name: dup\ndescription: d\nlinks:\n  default:\n    delay: 1ms\n    loss: 1%\n    delay: 2ms\n"
    error = refusal(text)
    assert error.key == "links.default.delay"
    assert "lines 5 and 7" in str(error)
    assert "<unicode string>" not in str(error)


def test_merge_keys_may_be_overridden_beside_them() -> None:
    text = GOOD + "phases:\n  - &p {at: 1s, links: {default: {delay: 2ms}}}\n  - {<<: *p, at: 2s}\n"
    assert [phase.at_s for phase in parse_profile(text).phases] == [1.0, 2.0]


@pytest.mark.parametrize(
    "tagged",
    [
        "!!python/object/apply:os.system ['true']",
        "!!python/name:os.system",
        "!include other.yaml",
        "!!binary aGVsbG8=",
        "!!set {a: null}",
    ],
)
def test_tags_outside_the_standard_ones_are_refused_with_what_is_allowed(tagged: str) -> None:
    error = refusal(f"name: {tagged}\ndescription: d\n")
    assert "is not allowed" in str(error)
    assert "!!str !!int !!float !!bool !!null !!seq !!map" in error.allowed
    assert "could not determine a constructor" not in str(error)


def test_standard_tags_are_accepted() -> None:
    assert parse_profile("name: !!str tiny\ndescription: !!str d\n").name == "tiny"


@pytest.mark.parametrize(("written", "problem"), [
    ("Bad Name!", "has characters that are not allowed"),
    ("UPPER", "has characters that are not allowed"),
    ("'   '", "must not be empty"),
    ("42", "must be a string"),
])
def test_a_bad_name_says_what_is_wrong_with_it(written: str, problem: str) -> None:
    error = refusal(f"name: {written}\ndescription: d\n")
    assert error.key == "name" and problem in str(error) and "is required" not in str(error)
    assert "lower-case letters" in error.allowed


def test_a_missing_name_says_so() -> None:
    assert "is required" in str(refusal("description: d\n"))


def test_values_are_shown_as_written_not_converted() -> None:
    message = str(refusal("name: t\ndescription: d\nphases:\n  - {at: 10ms}\n  - {at: 5ms}\n"))
    assert "'5ms'" in message and "5000" not in message


def test_invalid_utf8_is_refused() -> None:
    assert "not UTF-8" in str(refusal(b"name: \xff\xfe\n"))


def test_syntax_errors_give_line_and_column_without_the_parsers_name_for_the_input() -> None:
    message = str(refusal("name: [unclosed\ndescription: d\n"))
    assert "not valid YAML at line" in message and "<unicode string>" not in message
