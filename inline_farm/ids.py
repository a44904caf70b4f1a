"""Id helpers shared by the apps."""

from __future__ import annotations

import uuid
from typing import Any


def is_uuid(value: Any) -> bool:
    """Whether `value` reads as a UUID (ids from clients are checked before any query)."""
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True
