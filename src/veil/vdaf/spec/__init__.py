"""The draft-shaped scalar path of the VDAF draft: one report at a time, the
code that reads like the specification. It is the oracle the batched engine
is tested against and the codec of every message."""
