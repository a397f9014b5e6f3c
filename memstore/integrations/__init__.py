"""Adapters that make memstore the memory of agent frameworks (optional extras).

Each adapter lives in its own module and imports its framework only there, so
``import memstore`` (and ``import memstore.integrations``) never imports a framework:

* ``memstore.integrations.autogen.MemstoreChatCompletionContext`` (``memstore[autogen]``)
* ``memstore.integrations.langchain.MemstoreChatMessageHistory`` (``memstore[langchain]``)
* ``memstore.integrations.camel.MemstoreAgentMemory`` (``memstore[camel]``)
* ``memstore.integrations.openai_agents.MemstoreSession`` (``memstore[openai-agents]``)
* ``memstore.integrations.llama_index.MemstoreMemory`` and ``MemstoreChatStore``
  (``memstore[llama-index]``)
* ``memstore.integrations.langgraph.MemstoreGraphMemory`` (``memstore[langgraph]``)
* ``memstore.integrations.pydantic_ai.MemstoreConversationStore`` and
  ``MemstoreHistoryProcessor`` (``memstore[pydantic-ai]``)

Every adapter takes the conversation id first and the store second (a
[`MemoryStore`][memstore.MemoryStore] or an [`AsyncMemoryStore`][memstore.AsyncMemoryStore]),
plus an optional ``view=`` deciding what the framework is given. Pydantic AI's
conversation store is the exception: Pydantic AI passes the conversation id to each
call, so it takes only the store.
"""
