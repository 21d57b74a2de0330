"""Small shared glue imported by generated modules (no physics here)."""
