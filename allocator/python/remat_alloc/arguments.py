"""Argument checks for the C boundary, public so that packages over this library (remat)
check theirs alike: ctypes and C++ strings convert silently, so an int argument would wrap modulo 2**32 (device 2**32 is
device 0) and a string would end at its first NUL ("a\\0b" is "a")."""

from __future__ import annotations

import ctypes
import operator
import os

C_INT = (-(1 << 31), (1 << 31) - 1, "a C int")
C_POINTER = (0, (1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1, "an address")


def int_arg(function: str, name: str, value, c_type=C_INT) -> int:
    low, high, what = c_type
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{function}: {name} must be an int, got {type(value).__name__} {value!r:.80}")
    value = operator.index(value)
    if not low <= value <= high:
        raise ValueError(f"{function}: {name}={value} does not fit {what}; pass an int in [{low}, {high}]")
    return value


def text_arg(function: str, name: str, value) -> bytes:
    if not isinstance(value, str):
        hint = " (decode bytes first)" if isinstance(value, (bytes, bytearray)) else ""
        raise TypeError(f"{function}: {name} must be a str{hint}, got {type(value).__name__} {value!r:.80}")
    if "\0" in value:
        raise ValueError(f"{function}: {name} {value!r:.80} contains a NUL character; C strings end there, "
                         "so pass it without one")
    try:
        return value.encode()
    except UnicodeEncodeError as error:  # a lone surrogate, e.g. from os.fsdecode of bad bytes
        raise ValueError(f"{function}: {name} {value!r:.80} is not valid Unicode ({error.reason}); "
                         "pass text that encodes as UTF-8") from None


def path_arg(function: str, name: str, value) -> bytes:
    try:
        path = os.fsencode(value)  # str, bytes or os.PathLike, as open() takes
    except TypeError:
        raise TypeError(f"{function}: {name} must be a str, bytes or os.PathLike path, "
                        f"got {type(value).__name__} {value!r:.80}") from None
    if b"\0" in path:
        raise ValueError(f"{function}: {name} {os.fsdecode(path)!r:.80} contains a NUL character; "
                         "a path cannot hold one")
    return path
