"""memstore: durable, database-backed conversation memory for LLM agents."""
