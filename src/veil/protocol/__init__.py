"""Generated gRPC/protobuf code (never hand-edited)."""
