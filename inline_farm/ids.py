"""Id helpers shared by the apps."""

from __future__ import annotations

import re
import uuid
from typing import Any

# The one spelling of an id the farm accepts from clients: the canonical, lowercase, hyphenated
# form it hands out. Python's uuid.UUID also reads `urn:uuid:…`, braces, no hyphens and upper
# case, and PostgreSQL refuses some of those (a DataError, a 500), so ids are matched, not parsed.
_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_uuid(value: Any) -> bool:
    """Whether `value` is an id in canonical form (ids from clients are checked before any
    query; any other spelling names nothing, as an unknown id does). A `uuid.UUID` (a row's
    own pk) is one."""
    if isinstance(value, uuid.UUID):
        return True
    return isinstance(value, str) and _CANONICAL.fullmatch(value) is not None
