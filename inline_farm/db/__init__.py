"""The farm's database backend (settings: ENGINE "inline_farm.db"): Django's PostgreSQL backend,
whose pooled connections are checked without a round trip (inline_farm/db/base.py)."""
