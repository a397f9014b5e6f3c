"""The context builder: tiered blocks, strategies and formatters (pure: no SQL).

:mod:`memstore.context.builder` holds :class:`ContextBuilder` and its blocks,
:mod:`memstore.context.strategies` what a block does when it does not fit, and
:mod:`memstore.context.formatters` the helpers that put facts into a system message.
A history block reads a store only through its public ``window`` method; nothing here
imports SQLAlchemy, a store or :mod:`memstore._db`.
"""
