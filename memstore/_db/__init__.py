"""The SQL layer (private): everything that talks to the database.

Engine setup (``engine``, ``fork``), the tables (``schema``), the statements
(``statements``), row encoding and decoding (``rows``, ``readonly``), the row cache
(``cache``), the operations both stores run (``ops``, ``rewrite``, ``snapshots``,
``stateio``) and the SQL-backed history that views read (``window``). The stores
(`memstore.store`, `memstore.aio`) sit above it; views and the context
builder never import it.
"""
