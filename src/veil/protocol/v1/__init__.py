"""Generated from protos/veil/protocol/v1 by scripts/gen_protos.py."""
