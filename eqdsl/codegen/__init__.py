"""Code generation: kernel IR -> rendered, deterministic files."""
