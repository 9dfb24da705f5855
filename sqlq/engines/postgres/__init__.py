"""The PostgreSQL engine: one queue in a database, shared by any number of sqlq nodes.

Its schema lives in ``schema/NNN_*.sql``, applied in order by ``sqlq migrate``
(``migrate.py``), which records the version it reached; a server refuses to run
against a schema older or newer than the one it was built for.
"""
