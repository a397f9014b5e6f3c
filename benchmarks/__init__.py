"""memstore's benchmark harness (not part of the test suite).

Run ``python -m benchmarks --help``. One command generates a fixed-seed workload,
builds the same conversation history in every system (memstore, a hand-written
raw-SQL floor, LangChain, LlamaIndex, the OpenAI Agents SDK) on SQLite and
PostgreSQL, checks every system's context window for correctness, times window
fetches, appends and bulk imports, and writes a JSON result file, a markdown
report and a plot. See ``benchmarks/README.md``.
"""

__all__: list[str] = []
