"""Development tooling outside the runtime package (the API reference
builder); importable from the repository's root, as `bench` is."""
