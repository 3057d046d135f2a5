"""Argument checks shared by remat's modules, in the words of remat_alloc's (remat_alloc.arguments):
a name the C++ runtime keeps whole, a flag that is a bool."""

from remat_alloc.arguments import text_arg


def name_arg(function, parameter, value):
    """`value` when it is a str a C++ string keeps whole (no NUL)."""
    text_arg(function, parameter, value)
    return value


def flag_arg(function, parameter, value):
    if not isinstance(value, bool):
        raise TypeError(f"{function}: {parameter} must be True or False, got {type(value).__name__} {value!r:.80}")
    return value
