"""Django's PostgreSQL backend, with the pool's checkout check made free (see base.py)."""
