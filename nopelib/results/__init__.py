"""The committed result files: their schemas and checks, how they are loaded, written and signed, and the trained study read from them."""
