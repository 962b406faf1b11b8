"""``squall.fingerprint``: a short digest of a model's parameters, for one line a program prints at its end.

Ranks that should hold the same model (data-parallel training, after the last all-reduce) print the
same fingerprint; ``squall run --agree params`` then fails a run whose ranks silently diverged and
names the odd ones::

    import squall
    print(f"params {squall.fingerprint(model)}")       # --metric 'params=params (\\S+)' --agree params

It hashes every tensor's name, dtype, shape and bytes (BLAKE2b) in order: a module's ``state_dict()``
(parameters and buffers), a mapping of tensors, a sequence of tensors or arrays, one tensor, or bytes.
Equal fingerprints mean bit-for-bit equal parameters. Stdlib only at import time (torch and numpy are
used only when given one of their objects), so ``import squall`` stays cheap in any program.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

DIGITS = 16  # hexadecimal characters of a fingerprint (64 bits)


def _as_bytes(value: Any) -> tuple[str, bytes]:
    """(``dtype shape``, raw bytes) of a tensor, an array, bytes or a number."""
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes", bytes(value)
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        tensor = value.detach().cpu().contiguous()
        raw = tensor.view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes() if tensor.numel() else b""
        return f"{tensor.dtype} {tuple(tensor.shape)}", raw
    if hasattr(value, "tobytes") and hasattr(value, "dtype"):  # a numpy array
        return f"{value.dtype} {tuple(getattr(value, 'shape', ()))}", value.tobytes()
    if isinstance(value, int | float):
        return type(value).__name__, repr(value).encode()
    raise TypeError(f"squall.fingerprint: cannot hash a {type(value).__name__}; give a module, tensors, arrays or "
                    "bytes")


def _items(obj: Any) -> Iterable[tuple[str, Any]]:
    if hasattr(obj, "state_dict") and callable(obj.state_dict):  # a torch module (or an optimizer)
        return ((str(k), v) for k, v in obj.state_dict().items() if not isinstance(v, Mapping))
    if isinstance(obj, Mapping):
        return ((str(k), v) for k, v in obj.items())
    if isinstance(obj, list | tuple) or (hasattr(obj, "__iter__") and not hasattr(obj, "dtype")
                                          and not isinstance(obj, bytes | bytearray | memoryview | str)):
        return ((str(i), v) for i, v in enumerate(obj))
    return (("", obj),)


def fingerprint(obj: Any, digits: int = DIGITS) -> str:
    """A ``digits``-character hexadecimal digest of ``obj``'s parameters (see the module docstring).

    :raises TypeError: something that is neither a module, a mapping or sequence of tensors, nor a tensor.
    """
    if not 4 <= digits <= 64:
        raise ValueError(f"squall.fingerprint: digits must be 4..64, got {digits}")
    h = hashlib.blake2b(digest_size=32)
    for name, value in _items(obj):
        kind, raw = _as_bytes(value)
        h.update(f"{name}\0{kind}\0{len(raw)}\0".encode())
        h.update(raw)
    return h.hexdigest()[:digits]
