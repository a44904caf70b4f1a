"""The math expression of `math/expression` (ComfyUI's ComfyMathExpression): a safe evaluator.

Never Python's `eval`: the expression is parsed with `ast` and only a whitelist of node types is
walked — numbers, the names a…z (the node's inputs) and `values` (all of them, in order),
arithmetic, comparisons, `and` / `or` / `not`, `x if c else y`, and calls of the functions in
FUNCTIONS by plain name. Attributes, subscripts, strings, lambdas, comprehensions and any other
name are refused when the graph is submitted (`expression_problem`, a 422 naming the node), so
nothing an expression says can reach an object's insides. Sizes are bounded: the expression's
length, a power's exponent (MAX_EXPONENT, as ComfyUI caps it) and an integer's bits.

TORCH-FREE: validation (web) and the runner (worker) share it.
"""

from __future__ import annotations

import ast
import math
import operator
import string
from collections.abc import Callable
from typing import Any

NAMES = tuple(string.ascii_lowercase)  # the node's inputs, as ComfyUI's autogrow names them
MAX_EXPONENT = 4000
MAX_INT_BITS = 4096  # an integer wider than this is refused (2**4000 fits; 10**10**10 does not)
MAX_LENGTH = 1000
MAX_DEPTH = 64  # nesting of the syntax tree: evaluation recurses once per level


class ExpressionError(ValueError):
    """The expression cannot be evaluated; the message says why (shown to the user)."""


def _pow(base: Any, exp: Any) -> Any:
    if abs(exp) > MAX_EXPONENT:
        raise ExpressionError(f"exponent {exp} exceeds the maximum allowed ({MAX_EXPONENT})")
    if isinstance(base, int) and isinstance(exp, int) and base.bit_length() * exp > MAX_INT_BITS:
        raise ExpressionError(f"the power would be wider than {MAX_INT_BITS} bits")
    return operator.pow(base, exp)


def _sum(*args: Any) -> Any:
    """`sum(values)` and `sum(a, b, c)` alike, as ComfyUI's node allows."""
    if len(args) == 1 and isinstance(args[0], list):
        return sum(args[0])
    return sum(args)


def _one_or_many(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], list):
            return fn(args[0])
        return fn(*args)

    return call


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sum": _sum, "min": _one_or_many(min), "max": _one_or_many(max), "abs": abs, "round": round,
    "pow": _pow, "sqrt": math.sqrt, "ceil": math.ceil, "floor": math.floor, "log": math.log,
    "log2": math.log2, "log10": math.log10, "sin": math.sin, "cos": math.cos, "tan": math.tan,
    "int": int, "float": float,
}
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: _pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}


def expression_parse(text: str) -> ast.expr:
    """The checked syntax tree of `text`; ExpressionError names what is not allowed."""
    if not text.strip():
        raise ExpressionError("the expression is empty")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"the expression is {len(text)} characters (max {MAX_LENGTH})")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as exc:  # the parser's own depth limits
        raise ExpressionError(f"not an expression: {getattr(exc, 'msg', type(exc).__name__)}") \
            from None
    for node in ast.walk(tree):
        _allowed(node)
    _depth_check(tree)
    return tree.body


def _depth_check(tree: ast.AST) -> None:
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ExpressionError(f"the expression is nested more than {MAX_DEPTH} levels deep")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def expression_problem(text: str) -> str | None:
    """Why `text` is no valid expression, or None (validation's check at submit)."""
    try:
        expression_parse(text)
    except ExpressionError as exc:
        return str(exc)
    return None


def _allowed(node: ast.AST) -> None:
    ok = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp, ast.BoolOp,
          ast.And, ast.Or, ast.Compare, ast.IfExp, ast.Call, *_BINARY, *_UNARY, *_COMPARE)
    if not isinstance(node, ok):
        raise ExpressionError(f"{type(node).__name__} is not allowed in a math expression")
    if isinstance(node, ast.Constant) and (
        isinstance(node.value, bool) or not isinstance(node.value, int | float)
    ):
        raise ExpressionError(f"only numbers are allowed as constants, not {node.value!r}")
    if isinstance(node, ast.Name) and node.id not in (*NAMES, "values", *FUNCTIONS):
        raise ExpressionError(f"unknown name {node.id!r} (inputs are a…z and values)")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ExpressionError("only the functions " + ", ".join(FUNCTIONS) + " can be called")
        if node.keywords:
            raise ExpressionError("keyword arguments are not allowed")


def expression_evaluate(text: str, names: dict[str, Any]) -> int | float | bool:
    """Evaluate `text` with the inputs `names` (a…z that are wired or set); a number or a bool."""
    context = {name: value for name, value in names.items() if value is not None}
    context["values"] = list(context.values())
    try:
        result = _eval(expression_parse(text), context)
    except ExpressionError:
        raise
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise ExpressionError(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(result, int | float):  # bool is an int
        raise ExpressionError(f"the result is {type(result).__name__}, not a number")
    return result


def _eval(node: ast.expr, names: dict[str, Any]) -> Any:
    value = _eval_node(node, names)
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise ExpressionError(f"an intermediate integer is wider than {MAX_INT_BITS} bits")
    return value


def _eval_node(node: ast.expr, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ExpressionError(f"input {node.id!r} is not connected")
        return names[node.id]
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_eval(node.left, names), _eval(node.right, names))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, names))
    if isinstance(node, ast.BoolOp):
        return _bool_op(node, names)
    if isinstance(node, ast.Compare):
        return _compare(node, names)
    if isinstance(node, ast.IfExp):
        chosen = node.body if _eval(node.test, names) else node.orelse
        return _eval(chosen, names)
    if isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)  # checked by _allowed
        return FUNCTIONS[node.func.id](*(_eval(arg, names) for arg in node.args))
    raise ExpressionError(f"{type(node).__name__} is not allowed")  # unreachable past _allowed


def _bool_op(node: ast.BoolOp, names: dict[str, Any]) -> Any:
    is_and = isinstance(node.op, ast.And)
    value: Any = None
    for operand in node.values:
        value = _eval(operand, names)
        if bool(value) != is_and:  # `and` stops at a falsy value, `or` at a truthy one
            return value
    return value


def _compare(node: ast.Compare, names: dict[str, Any]) -> bool:
    left = _eval(node.left, names)
    for op, right_node in zip(node.ops, node.comparators, strict=True):
        right = _eval(right_node, names)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True
