"""Typed state: Spark types and their exact encodings, the codecs chosen by a state
variable's schema, the schema records a restore checks, and what readers show of a value."""
