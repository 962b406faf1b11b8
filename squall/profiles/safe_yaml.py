"""YAML for profiles, read so that hostile or careless files stay small and fast to refuse.

Before anything is built, one pass over the parser's events (no recursion, nothing expanded):

- the text is at most :data:`MAX_FILE_BYTES` long;
- the document has at most :data:`MAX_NODES` nodes **after alias expansion** and nests at most
  :data:`MAX_DEPTH` deep, counted without expanding anything: an anchor's expanded size is
  remembered when its node ends, so every later alias adds that size in O(1) (a "billion laughs"
  bomb of nine nested lists of nine aliases is refused after about a hundred events);
- explicit tags are limited to the standard scalar, sequence and mapping tags (:data:`ALLOWED_TAGS`);
  ``!!python/...``, ``!include`` and the like are refused by name;
- mapping keys are plain scalars and none is written twice in one mapping (the message names the
  key path and both lines; ``<<`` merge keys may be overridden by keys written beside them).

Only then is the document built, with libyaml's ``CSafeLoader`` where it is installed (the pure
Python ``SafeLoader`` otherwise). Every refusal is a :class:`~squall.profiles.errors.ProfileError`
naming the file once, a key path and what is allowed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Final

import yaml

from squall.profiles.errors import ROOT_KEY, ProfileError, shown

logger = logging.getLogger(__name__)

MAX_FILE_BYTES: Final = 1 << 20  # 1 MiB: the shipped profiles are under 4 KiB
MAX_NODES: Final = 100_000  # scalars, lists and mappings after alias expansion
MAX_DEPTH: Final = 64  # nested lists/mappings, also through aliases
YAML_KEY: Final = "(yaml)"  # key path of errors that concern the YAML itself

_STD: Final = "tag:yaml.org,2002:"
ALLOWED_TAGS: Final = frozenset(_STD + t for t in ("str", "int", "float", "bool", "null", "seq", "map"))
TAGS_ALLOWED_TEXT: Final = "no tag, or one of !!str !!int !!float !!bool !!null !!seq !!map"
_MERGE_KEY: Final = "<<"

#: libyaml's loader when PyYAML was built with it (about 10x faster), else the pure-Python one.
BASE_LOADER: Final[type[yaml.SafeLoader]] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class _Frame:
    """A list or mapping whose end event has not come yet."""

    anchor: str | None  # its anchor, if it has one
    is_map: bool  # mapping (keys and values alternate) or sequence
    size: int = 1  # nodes so far, itself included
    height: int = 1  # deepest nesting below, itself included
    index: int = 0  # items so far (a mapping counts keys and values)
    key: str = ""  # a mapping's current key, for key paths
    keys: dict[str, int] = field(default_factory=dict)  # key -> line (1-based) where it was written


def _keyed(path: str, key: str) -> str:
    return key if path == ROOT_KEY else f"{path}.{key}"


class _Census:
    """Counts nodes and depth over the event stream, checking tags and keys on the way."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[int, int]] = {}  # anchor -> (expanded size, height) of a finished node
        self.open_anchors: set[str] = set()
        self.total = 0

    def path(self) -> str:
        """Key path of the node the next event starts."""
        path = ROOT_KEY
        for frame in self.stack:
            if frame.is_map:
                path = _keyed(path, frame.key or "?") if frame.index % 2 else path
            else:
                path = f"{path}[{frame.index}]"
        return path

    def error(self, problem: str, *, key: str | None = None, allowed: str = "") -> ProfileError:
        """A ProfileError at the node the next event starts (or at ``key``)."""
        return ProfileError(self.source, key or self.path(), problem, allowed=allowed)

    def event(self, event: yaml.Event) -> None:
        """Account for one parser event."""
        if isinstance(event, yaml.ScalarEvent | yaml.SequenceStartEvent | yaml.MappingStartEvent):
            self._check_tag(event)
        if isinstance(event, yaml.ScalarEvent):
            self._check_key(event)
            self._add(1, 1, event.anchor)
        elif isinstance(event, yaml.AliasEvent):
            self._alias(event)
        elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            self._open(event)
        elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            frame = self.stack.pop()
            if frame.anchor is not None:
                self.open_anchors.discard(frame.anchor)
            self._add(frame.size, frame.height, frame.anchor, counted=True)

    def _check_tag(self, event: yaml.NodeEvent) -> None:
        tag = getattr(event, "tag", None)
        if tag is None or tag in ("!", *ALLOWED_TAGS):
            return
        shown_tag = "!!" + tag[len(_STD):] if tag.startswith(_STD) else tag
        raise self.error(f"the tag {shown_tag} is not allowed (profiles are data)", allowed=TAGS_ALLOWED_TEXT)

    def _in_key_position(self) -> bool:
        return bool(self.stack) and self.stack[-1].is_map and self.stack[-1].index % 2 == 0

    def _check_key(self, event: yaml.ScalarEvent) -> None:
        if not self._in_key_position():
            return
        frame = self.stack[-1]
        key = event.value
        line = event.start_mark.line + 1 if event.start_mark else 0
        if key in frame.keys and key != _MERGE_KEY:
            raise self.error(
                f"the key {shown(key)} is written twice in one mapping (lines {frame.keys[key]} and {line})",
                key=_keyed(self.path(), shown(key, quote=False)),
                allowed="each key once per mapping",
            )
        frame.keys[key] = line
        frame.key = shown(key, quote=False)

    def _open(self, event: yaml.CollectionStartEvent) -> None:
        if self._in_key_position():
            raise self.error("a list or mapping used as a mapping key", allowed="keys that are plain names")
        if len(self.stack) >= MAX_DEPTH:
            raise self.error(f"nested more than {MAX_DEPTH} deep", allowed=f"at most {MAX_DEPTH} nested lists/mappings")
        if event.anchor is not None:
            self.open_anchors.add(event.anchor)
        self.stack.append(_Frame(event.anchor, isinstance(event, yaml.MappingStartEvent)))
        self._count(1)

    def _alias(self, event: yaml.AliasEvent) -> None:
        name = event.anchor
        if name in self.open_anchors:
            raise self.error(f"the alias *{shown(name, quote=False)} refers to a node that contains it",
                             allowed="aliases to earlier, finished nodes")
        if name not in self.anchors:
            raise self.error(f"the alias *{shown(name, quote=False)} has no anchor before it",
                             allowed="aliases to an earlier &anchor")
        if self._in_key_position():
            raise self.error("an alias used as a mapping key", allowed="keys that are plain names")
        size, height = self.anchors[name]
        self._count(size)
        self._add(size, height, None, counted=True)

    def _add(self, size: int, height: int, anchor: str | None, *, counted: bool = False) -> None:
        """A finished node of ``size`` nodes joins its parent (or is the document)."""
        if not counted:
            self._count(size)
        if anchor is not None:
            self.anchors[anchor] = (size, height)
        if len(self.stack) + height > MAX_DEPTH:
            raise self.error(f"nested more than {MAX_DEPTH} deep (through aliases)",
                             allowed=f"at most {MAX_DEPTH} nested lists/mappings")
        if self.stack:
            parent = self.stack[-1]
            parent.size += size
            parent.height = max(parent.height, height + 1)
            parent.index += 1

    def _count(self, size: int) -> None:
        self.total += size
        if self.total > MAX_NODES:
            raise self.error(
                f"the document expands to more than {MAX_NODES} YAML nodes (each alias counts as a copy)",
                key=ROOT_KEY,
                allowed=f"at most {MAX_NODES} nodes; a profile needs a few hundred",
            )


class _Loader(BASE_LOADER):  # type: ignore[misc,valid-type]
    """The base loader, plus a last check that keys are usable and not repeated (e.g. ``1`` and ``0x1``)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[object, object]:
    """Keys written in the mapping must differ; keys merged in with ``<<`` may be overridden."""
    written = [key_node for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge"]
    loader.flatten_mapping(node)
    seen: set[object] = set()
    for key_node in written:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool) or key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicated or unusable key {shown(key)}",
                                                    key_node.start_mark)
        seen.add(key)
    return dict(loader.construct_pairs(node, deep=True))


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_error(source: str, exc: yaml.YAMLError) -> ProfileError:
    """The parser's complaint with a line and column, without its name for the input (``<unicode string>``)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        words = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        return ProfileError(source, YAML_KEY, f"not valid YAML{where}: {shown(words, quote=False, limit=160)}")
    return ProfileError(source, YAML_KEY, f"not valid YAML: {shown(str(exc), quote=False, limit=160)}")


def _text_of(data: str | bytes, source: str) -> str:
    """The text, refused when longer than :data:`MAX_FILE_BYTES` or not UTF-8."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_BYTES:
        raise ProfileError(source, ROOT_KEY, f"the file is {size} bytes long",
                           allowed=f"at most {MAX_FILE_BYTES} bytes ({MAX_FILE_BYTES >> 10} KiB)")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(source, ROOT_KEY, f"not UTF-8 text (byte {exc.start})", allowed="UTF-8 text") from None


def read_yaml(data: str | bytes, source: str) -> object:
    """Check, then build, one YAML document; raises :class:`ProfileError` for anything refused."""
    text = _text_of(data, source)
    census = _Census(source)
    try:
        for event in yaml.parse(text, Loader=BASE_LOADER):
            census.event(event)
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass; tags already checked
    except yaml.YAMLError as exc:
        raise _yaml_error(source, exc) from None
    except (RecursionError, ValueError, OverflowError) as exc:
        if isinstance(exc, ProfileError):
            raise
        raise ProfileError(source, YAML_KEY, f"cannot be read: {type(exc).__name__}",
                           allowed="plain YAML data") from None
