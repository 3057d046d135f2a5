"""Argument checks shared by remat's modules, in the words of remat_alloc's (remat_alloc.arguments):
a name the C++ runtime keeps whole, a flag that is a bool."""

from remat_alloc.arguments import text_arg


class ArgumentTypeError(TypeError, RuntimeError):
    """An argument of the wrong type: the TypeError Python raises for it, and the RuntimeError
    torch_remat raises, so that code written for either catches it."""


def name_arg(function, parameter, value):
    """`value` when it is a str a C++ string keeps whole (no NUL)."""
    try:
        text_arg(function, parameter, value)
    except TypeError as error:
        raise ArgumentTypeError(str(error)) from None
    return value


def flag_arg(function, parameter, value):
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{function}: {parameter} must be True or False, got {type(value).__name__} {value!r:.80}")
    return value
