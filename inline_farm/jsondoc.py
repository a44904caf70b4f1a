"""Reading a client's JSON document: the one rule /v1 and the ComfyUI door share.

Python's json module recurses once per nesting level: a few kilobytes of `[[[[…` raise
RecursionError (a 500 wherever it is not caught), and a document just under Python's limit
still makes every later walk over it (pydantic, json.dumps into PostgreSQL) risk the same. Real
documents (graphs, ComfyUI workflows with their subgraphs) nest a dozen levels; so a document
nested deeper than MAX_DEPTH is refused as unreadable, as is one json cannot parse at all.
"""

from __future__ import annotations

import json
import math
from typing import Any

from apps.graphs.schema import text_problem

MAX_DEPTH = 64


class JsonUnreadable(ValueError):
    """The body is not a JSON document the farm reads (malformed, or nested too deep)."""


def json_parse(raw: bytes | str) -> Any:
    """The JSON document `raw`; JsonUnreadable when it is not JSON or nests past MAX_DEPTH."""
    try:
        document = json.loads(raw)
    except RecursionError:
        raise JsonUnreadable(f"the document nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise JsonUnreadable(f"not JSON: {exc}") from None
    if _depth_over(document, MAX_DEPTH):
        raise JsonUnreadable(f"the document nests deeper than {MAX_DEPTH} levels")
    return document


def _depth_over(document: Any, limit: int) -> bool:
    """Whether `document` nests more than `limit` arrays/objects deep (iterative)."""
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth >= limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return False


def printable(text: str) -> str:
    """`text` with NULs and lone surrogates escaped, safe to quote in an answer or a log."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def json_problem(value: Any, *, magnitude: float | None = None) -> tuple[str, str] | None:
    """(where, why) PostgreSQL could not store `value` as JSON — a NUL or a lone surrogate in a
    string or key, NaN or ±Infinity — or, with `magnitude`, a number beyond ±magnitude; None
    when there is none. `where` is a dotted path from the top."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return where, f"text {problem}"
        elif isinstance(item, float) and not math.isfinite(item):
            return where, f"{item} is not a number JSON can store"
        elif (magnitude is not None and isinstance(item, int | float)
              and not isinstance(item, bool) and abs(item) > magnitude):
            return where, f"the number is beyond ±{magnitude:g}"
        elif isinstance(item, dict):
            for key, child in item.items():
                path = f"{where}.{printable(str(key))}" if where else printable(str(key))
                stack.append((str(key), path))
                stack.append((child, path))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return None
