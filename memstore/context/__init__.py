"""The context builder: tiered blocks, strategies and formatters (pure: no SQL).

`memstore.context.builder` holds [`ContextBuilder`][memstore.ContextBuilder] and its blocks,
`memstore.context.compiled` what it returns (the compiled context and its report),
`memstore.context.strategies` what a block does when it does not fit, and
`memstore.context.formatters` the helpers that put facts into a system message.
A history block reads a store only through its public ``window`` method; nothing here
imports SQLAlchemy, a store or `memstore._db`.
"""
