"""Long-term memory: recognising what is already known, searching it, tidying it.

`values` (the contradiction guard) and `recognition` (the two-tier rule) decide; `keeper`
remembers, searches and back-fills through the store, the embedder and the fingerprint
index; `consolidation` mutes duplicates already stored, reversibly; `setup` builds the
keeper from the server's settings.
"""
