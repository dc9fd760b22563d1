"""The committed result files: their schemas, checks, loading, writing and the manifest."""
