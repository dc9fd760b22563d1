"""The studies the chapters read, live or committed, and the committed result files."""
