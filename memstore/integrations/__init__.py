"""Adapters that plug memstore into agent frameworks (each one an optional extra).

Import the module of the framework you use, for example
``from memstore.integrations.camel import MemstoreAgentMemory``. Importing this
package imports no framework.
"""
